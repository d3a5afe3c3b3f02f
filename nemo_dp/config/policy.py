"""Structured-config schemas of the ``policy`` group options ``tiny`` and ``hf``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING

from nemo_dp.config.precision import resolve_precision_name
from nemo_dp.utils.config_checks import Checked, at_least_field, one_of
from nemo_dp.config.schema import PolicyConfig

__all__ = [
    "POLICY_DEVICES",
    "HF_ATTN_NAMES",
    "TinyPolicyConfig",
    "HFModelSchema",
    "HFPolicyConfig",
    "register_policy_configs",
]

POLICY_DEVICES: tuple[str, ...] = ("cpu", "cuda")
HF_ATTN_NAMES: tuple[str, ...] = ("sdpa", "eager")


@dataclass
class TinyPolicyConfig(PolicyConfig):
    """``policy=tiny``: the built-in transformer shaped by ``policy.model``."""

    kind: str = "tiny"
    device: str = "cpu"
    precision: Optional[str] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of("policy.kind", self.kind, ("tiny",))
        one_of("policy.device", self.device, POLICY_DEVICES)
        resolve_precision_name(self.precision, None)


@dataclass
class HFModelSchema(Checked, key="policy.model"):
    """``policy.model`` of ``policy=hf``: only the sequence bound (the shape is the checkpoint's)."""

    max_seq_len: int = at_least_field(128, 2)


@dataclass
class HFPolicyConfig(PolicyConfig):
    """``policy=hf``: a HuggingFace causal LM from a local directory (``dtype``, the older alias of ``precision``
    ``32-true`` / ``bf16-true``, must agree with it; ``None`` train attention = ``attn_implementation``)."""

    kind: str = "hf"
    device: str = "cpu"
    model: HFModelSchema = field(default_factory=HFModelSchema)  # type: ignore[assignment]
    model_name_or_path: str = MISSING
    tokenizer_name_or_path: Optional[str] = None
    precision: Optional[str] = None
    dtype: Optional[str] = None
    attn_implementation: str = "sdpa"
    train_attn_implementation: Optional[str] = None
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of("policy.kind", self.kind, ("hf", "hf_vlm"))
        one_of("policy.device", self.device, POLICY_DEVICES)
        resolve_precision_name(self.precision, self.dtype)
        one_of("policy.attn_implementation", self.attn_implementation, HF_ATTN_NAMES)
        if self.train_attn_implementation is not None:
            one_of("policy.train_attn_implementation", self.train_attn_implementation, HF_ATTN_NAMES)
        if not str(self.model_name_or_path).strip():
            raise ValueError("policy.model_name_or_path: must be a local checkpoint directory")


def register_policy_configs() -> None:
    """Store ``policy_tiny_schema`` / ``policy_hf_schema`` at root level (idempotent; not group options)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="policy_tiny_schema", node=TinyPolicyConfig)
    cs.store(name="policy_hf_schema", node=HFPolicyConfig)
