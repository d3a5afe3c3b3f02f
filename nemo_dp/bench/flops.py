"""Model FLOPs of a GRPO step's phases, and the host's matmul peak to hold them against.

Only *useful* FLOPs count (weight matmuls of processed tokens, causal attention, vocabulary
projections of response positions), so extra work a trainer does shows as a lower achieved rate.
Per sample (prompt ``P``, response ``R`` tokens): generation applies the weights to ``P + R - 1``
tokens with ``R`` projections; a log-prob forward to ``P + R``; training costs three forwards.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CPU_FLAGS_OF_INTEREST",
    "ModelShape",
    "PhaseFlops",
    "phase_flops",
    "matmul_gflops",
    "cpu_info",
]

#: The ``/proc/cpuinfo`` flags that decide float32 / bfloat16 matmul speed on x86.
CPU_FLAGS_OF_INTEREST: tuple[str, ...] = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-style decoder that its FLOPs depend on.

    Attributes:
        intermediate: MLP intermediate size (gated MLP: three projections).
        kv_heads: Key/value heads (grouped-query attention).
    """

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ModelShape.{name}: must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """Read the shape from a parsed HuggingFace ``config.json`` (Llama / Qwen2 / Mistral keys).

        Raises:
            KeyError: A key the shape needs is missing (named).
        """
        missing = [k for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                               "vocab_size") if k not in config]
        if missing:
            raise KeyError(f"config.json lacks {missing} (needs a Llama-style decoder config)")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            intermediate=int(config["intermediate_size"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab=int(config["vocab_size"]),
        )

    @classmethod
    def from_model_dir(cls, directory: str | Path) -> ModelShape:
        """Like :meth:`from_hf_config`, reading a ``save_pretrained`` directory's ``config.json``."""
        import json

        return cls.from_hf_config(json.loads((Path(directory) / "config.json").read_text()))

    @property
    def body_params(self) -> int:
        """Weights applied to every token: attention projections and the gated MLP."""
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        attn = self.hidden * q_out + 2 * self.hidden * kv_out + q_out * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp)

    @property
    def head_params(self) -> int:
        """Weights of the vocabulary projection."""
        return self.hidden * self.vocab

    def forward_flops(self, tokens: float, scored: float) -> float:
        """FLOPs (a multiply-add counts 2) of one causal forward over ``tokens`` positions,
        ``scored`` of them projected to the vocabulary."""
        attention = 4.0 * self.layers * self.heads * self.head_dim * tokens * (tokens + 1) / 2.0
        return 2.0 * self.body_params * tokens + attention + 2.0 * self.head_params * scored


@dataclass(frozen=True)
class PhaseFlops:
    """Useful FLOPs of one GRPO step, per phase (see the module docstring)."""

    generation: float
    logprobs: float
    train: float

    def as_dict(self) -> dict[str, float]:
        """``{"generation", "logprobs", "train"}``."""
        return {"generation": self.generation, "logprobs": self.logprobs, "train": self.train}


def phase_flops(
    shape: ModelShape, *, samples: int, prompt_len: float, response_len: float, logprob_forwards: int
) -> PhaseFlops:
    """The useful FLOPs of one GRPO step's phases.

    Args:
        samples: Rows in the step (prompts x group size).
        prompt_len: Mean prompt length in tokens.
        response_len: Mean response length in tokens (eos included); at least 1.
        logprob_forwards: Forwards of the log-prob phase per row (previous-policy and/or
            reference log-probs: 0, 1 or 2).

    Raises:
        ValueError: On a non-positive size or a negative forward count.
    """
    if samples < 1 or prompt_len <= 0 or response_len < 1:
        raise ValueError(
            f"phase_flops: need samples >= 1, prompt_len > 0, response_len >= 1; got {samples}, "
            f"{prompt_len}, {response_len}"
        )
    if logprob_forwards < 0:
        raise ValueError(f"phase_flops: logprob_forwards must be >= 0, got {logprob_forwards}")
    seq = prompt_len + response_len
    generation = shape.forward_flops(seq - 1, response_len)
    one_forward = shape.forward_flops(seq, response_len)
    return PhaseFlops(
        generation=samples * generation,
        logprobs=samples * logprob_forwards * one_forward,
        train=samples * 3.0 * one_forward,
    )


def matmul_gflops(m: int, k: int, n: int, dtype: str, threads: int, *, min_seconds: float = 0.5) -> float:
    """Measured GFLOP/s of an ``[m, k] @ [k, n]`` matmul in ``dtype`` on ``threads`` threads.

    The best of repeated timed batches (after a warm-up), so a momentarily busy core costs
    less; the previous torch thread count is restored.

    Counts ``2 m k n`` FLOPs per matmul; ``dtype`` is ``float32`` or ``bfloat16``; ``min_seconds``
    is the wall time spent measuring.

    Raises:
        ValueError: On an unknown dtype or a non-positive size.
    """
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if dtype not in dtypes:
        raise ValueError(f"matmul_gflops: dtype must be one of {sorted(dtypes)}, got {dtype!r}")
    if min(m, k, n, threads) < 1:
        raise ValueError(f"matmul_gflops: sizes and threads must be >= 1, got {(m, k, n, threads)}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(m, k, dtype=dtypes[dtype])
        b = torch.randn(k, n, dtype=dtypes[dtype])
        for _ in range(3):
            torch.mm(a, b)
        best = float("inf")
        deadline = time.perf_counter() + min_seconds
        while True:
            t0 = time.perf_counter()
            for _ in range(5):
                torch.mm(a, b)
            best = min(best, (time.perf_counter() - t0) / 5)
            if time.perf_counter() >= deadline:
                break
    finally:
        torch.set_num_threads(before)
    return 2.0 * m * k * n / best / 1e9


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU's model name and which of :data:`CPU_FLAGS_OF_INTEREST` it has.

    ``cpuinfo`` is ``/proc/cpuinfo``'s text (read from the host when ``None``; empty where the file
    does not exist). Returns ``{"model": str, "flags": {flag: bool}, "logical_cpus": int}``.
    """
    import os

    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.exists() else ""
    model, flags = "unknown", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {
        "model": model,
        "flags": {f: f in flags for f in CPU_FLAGS_OF_INTEREST},
        "logical_cpus": os.cpu_count() or 0,
    }
