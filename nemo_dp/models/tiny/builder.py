"""``policy=tiny`` builder: ``TinyCausalLM`` shaped by ``policy.model`` and the char tokenizer."""

from __future__ import annotations

from typing import Any

from nemo_dp.models.builders import ModelBuilder, cfg_get
from nemo_dp.models.precision import resolve_precision
from nemo_dp.models.tiny.model import ModelConfig, TinyCausalLM
from nemo_dp.models.tiny.tokenizer import CharTokenizer

__all__ = ["BUILDER", "tiny_model_config"]


def tiny_model_config(policy_cfg: Any, vocab_size: int) -> ModelConfig:
    """The :class:`ModelConfig` (validated) of ``policy.model``."""
    m = cfg_get(policy_cfg, "model")
    return ModelConfig(
        vocab_size=int(vocab_size),
        n_layers=int(cfg_get(m, "n_layers")),
        d_model=int(cfg_get(m, "d_model")),
        n_heads=int(cfg_get(m, "n_heads")),
        max_seq_len=int(cfg_get(m, "max_seq_len")),
        dropout=float(cfg_get(m, "dropout")),
    )


def _build_model(policy_cfg: Any, vocab_size: int, seed: int) -> TinyCausalLM:
    # Initialised in float32 (the same numbers whatever the precision), then cast for bf16-true.
    model = TinyCausalLM(tiny_model_config(policy_cfg, vocab_size), seed=seed)
    return model.to(resolve_precision(policy_cfg).param_dtype)


def _validate(policy_cfg: Any) -> None:
    try:
        tiny_model_config(policy_cfg, CharTokenizer().vocab_size)
    except ValueError as exc:
        raise ValueError(f"policy.model: {exc}") from exc


BUILDER = ModelBuilder(
    kind="tiny", build_model=_build_model, build_tokenizer=lambda policy_cfg: CharTokenizer(), validate=_validate,
    load_pretrained=lambda policy_cfg, directory: TinyCausalLM.from_pretrained(directory),
)
