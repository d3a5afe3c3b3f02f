"""The ``policy=hf`` keys as one typed value, read once from the ``policy`` node."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from nemo_dp.models.builders import cfg_get
from nemo_dp.models.precision import resolve_precision

__all__ = ["HF_DTYPES", "HF_ATTN_IMPLEMENTATIONS", "HFSettings", "hf_settings"]

#: Weight dtype names (``HFSettings.dtype``, from ``policy.precision``) and their torch dtypes.
HF_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Legal ``policy.attn_implementation`` values.
HF_ATTN_IMPLEMENTATIONS: tuple[str, ...] = ("sdpa", "eager")


@dataclass(frozen=True)
class HFSettings:
    """The ``policy=hf`` keys (the tokenizer defaults to the model directory; ``dtype`` from ``policy.precision``)."""

    model_name_or_path: str
    tokenizer_name_or_path: str
    dtype: str
    attn_implementation: str
    trust_remote_code: bool

    @property
    def torch_dtype(self) -> torch.dtype:
        return HF_DTYPES[self.dtype]


def hf_settings(policy_cfg: Any) -> HFSettings:
    """Read and check the ``policy=hf`` keys (no file access); ``ValueError`` naming a missing or illegal one."""
    model = cfg_get(policy_cfg, "model_name_or_path", None)
    if model is None or not str(model).strip() or str(model) == "???":
        raise ValueError(
            "policy.model_name_or_path: required with policy=hf; set it to a local checkpoint "
            "directory (config.json + *.safetensors + tokenizer files), e.g. one built by "
            "`python -m nemo_dp.models.hf.make_tiny --arch llama --out DIR`"
        )
    tok = cfg_get(policy_cfg, "tokenizer_name_or_path", None)
    dtype = "bfloat16" if resolve_precision(policy_cfg).param_dtype == torch.bfloat16 else "float32"
    attn = str(cfg_get(policy_cfg, "attn_implementation", "sdpa"))
    if attn not in HF_ATTN_IMPLEMENTATIONS:
        raise ValueError(f"policy.attn_implementation: got {attn!r}; legal values: {list(HF_ATTN_IMPLEMENTATIONS)}")
    remote = cfg_get(policy_cfg, "trust_remote_code", False)
    if not isinstance(remote, bool):
        raise ValueError(f"policy.trust_remote_code: must be true or false, got {remote!r}")
    model = os.path.expanduser(str(model))
    return HFSettings(
        model_name_or_path=model,
        tokenizer_name_or_path=os.path.expanduser(str(tok)) if tok not in (None, "") else model,
        dtype=dtype,
        attn_implementation=attn,
        trust_remote_code=remote,
    )
