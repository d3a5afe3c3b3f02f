"""The ``policy=tiny`` model: a small pre-LN causal transformer in plain PyTorch, saved as JSON + safetensors."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelConfig:
    """Shape of a :class:`TinyCausalLM` (``d_model`` divisible by ``n_heads``; ``max_seq_len`` learned positions)."""

    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    max_seq_len: int
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "max_seq_len"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {value}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"ModelConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ModelConfig.dropout must be in [0, 1), got {self.dropout}")


#: ``model_type`` written into a tiny model's ``config.json``.
TINY_MODEL_TYPE = "nemo_dp_tiny"


class KVCache:
    """Preallocated key/value buffers of ``max_len`` positions (prompt + new tokens) for incremental decoding."""

    def __init__(
        self, cfg: ModelConfig, batch_size: int, max_len: int, dtype: torch.dtype, device: torch.device | None = None
    ) -> None:
        head_dim = cfg.d_model // cfg.n_heads
        shape = (batch_size, cfg.n_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.length = 0
        self.max_len = max_len


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with an optional KV-cache path."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        bsz, seq, width = x.shape
        qkv = self.qkv(x).view(bsz, seq, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        drop = self.dropout if self.training else 0.0
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        else:
            start = cache.length
            cache.keys[layer][:, :, start : start + seq] = k
            cache.values[layer][:, :, start : start + seq] = v
            keys = cache.keys[layer][:, :, : start + seq]
            values = cache.values[layer][:, :, : start + seq]
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask, dropout_p=drop)
        return self.proj(y.transpose(1, 2).reshape(bsz, seq, width))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), cache=cache, layer=layer, attn_mask=attn_mask))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyCausalLM(nn.Module):
    """Small decoder-only transformer; with ``seed`` initialised from a private generator, else the global RNG."""

    def __init__(self, cfg: ModelConfig, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self._init_parameters(None if seed is None else torch.Generator().manual_seed(seed))

    def _init_parameters(self, gen: torch.Generator | None) -> None:
        # GPT-2 style: N(0, 0.02), residual projections scaled down by depth.
        resid_std = 0.02 / (2 * self.cfg.n_layers) ** 0.5
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif ".ln" in name or name.startswith("ln_f"):
                    p.fill_(1.0)
                elif name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                    p.normal_(0.0, resid_std, generator=gen)
                else:
                    p.normal_(0.0, 0.02, generator=gen)

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"TinyCausalLM: input_ids must be [B, S], got shape {tuple(input_ids.shape)}")
        if positions.numel() and int(positions.max()) >= self.cfg.max_seq_len:
            raise ValueError(
                f"TinyCausalLM: position {int(positions.max())} exceeds max_seq_len={self.cfg.max_seq_len}"
            )
        return self.drop(self.tok_emb(input_ids) + self.pos_emb(positions))

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(x))

    @property
    def max_positions(self) -> int:
        return self.cfg.max_seq_len

    @property
    def hidden_size(self) -> int:
        return self.cfg.d_model

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def _trunk(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self._embed(input_ids, positions)
        for block in self.blocks:
            x = block(x)
        return x

    def forward(self, input_ids: torch.Tensor, logits_from: int = 0) -> torch.Tensor:
        """Full causal forward pass (float32 logits ``[B, S - logits_from, V]``)."""
        trunk = self._trunk(input_ids)
        return self._head(trunk[:, logits_from:] if logits_from else trunk)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states ``[B, S, d_model]`` (what the LM head reads)."""
        return self.ln_f(self._trunk(input_ids))

    def lm_head_only_parameters(self) -> list[nn.Parameter]:
        """The untied LM head weight."""
        return [self.head.weight]

    def prefill(
        self, input_ids: torch.Tensor, key_valid: torch.Tensor, positions: torch.Tensor, max_len: int
    ) -> tuple[torch.Tensor, KVCache]:
        """Left-padded prompts through a fresh cache of ``max_len`` positions."""
        bsz, width = input_ids.shape
        # Pad queries may attend to themselves so that no softmax row is empty (their outputs
        # are never read); real queries see only real, earlier keys.
        causal = torch.tril(torch.ones((width, width), dtype=torch.bool, device=input_ids.device))
        eye = torch.eye(width, dtype=torch.bool, device=input_ids.device)
        mask = (causal.unsqueeze(0) & key_valid[:, None, :]) | eye.unsqueeze(0)
        cache = self.new_cache(bsz, max_len)
        logits = self.forward_cached(input_ids, positions, cache, mask.unsqueeze(1))
        return logits[:, -1], cache

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor, cache: KVCache
    ) -> tuple[torch.Tensor, KVCache]:
        """One token per row through the cache."""
        logits = self.forward_cached(tokens, positions, cache, key_valid[:, None, None, :])
        return logits[:, -1], cache

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write ``config.json`` and ``model.safetensors``."""
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        config = {"model_type": TINY_MODEL_TYPE, **dataclasses.asdict(self.cfg)}
        (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str]) -> TinyCausalLM:
        """Load :meth:`save_pretrained` output (``FileNotFoundError``; ``ValueError`` for a foreign config)."""
        from safetensors.torch import load_file

        base = Path(directory)
        cfg_path = base / "config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"TinyCausalLM.from_pretrained: {cfg_path} is missing")
        raw: dict[str, Any] = json.loads(cfg_path.read_text(encoding="utf-8"))
        if raw.pop("model_type", None) != TINY_MODEL_TYPE:
            raise ValueError(f"TinyCausalLM.from_pretrained: {cfg_path} is not a {TINY_MODEL_TYPE!r} config")
        names = {f.name for f in dataclasses.fields(ModelConfig)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ValueError(f"TinyCausalLM.from_pretrained: {cfg_path} has unknown keys {unknown}")
        model = cls(ModelConfig(**raw), seed=0)
        model.load_state_dict(load_file(str(base / "model.safetensors")))
        return model

    def new_cache(self, batch_size: int, max_len: int) -> KVCache:
        """Allocate a KV cache of ``max_len`` positions for :meth:`forward_cached`."""
        weight = self.tok_emb.weight
        return KVCache(self.cfg, batch_size, max_len, weight.dtype, weight.device)

    def forward_cached(
        self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, attn_mask: torch.Tensor
    ) -> torch.Tensor:
        """Logits of ``T`` new tokens per row ``[B, T]``, attending to the cache (``ValueError`` if too short).

        ``attn_mask`` is bool ``[B, 1, T, cache.length + T]``, True where a query may attend.
        """
        seq = input_ids.shape[1]
        if cache.length + seq > cache.max_len:
            raise ValueError(
                f"TinyCausalLM: KV cache of {cache.max_len} positions cannot take {seq} more "
                f"after {cache.length}"
            )
        x = self._embed(input_ids, positions)
        for i, block in enumerate(self.blocks):
            x = block(x, cache=cache, layer=i, attn_mask=attn_mask)
        cache.length += seq
        return self._head(x)
