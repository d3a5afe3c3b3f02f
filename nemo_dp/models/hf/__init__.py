"""The ``policy=hf`` model family: HuggingFace causal LMs from local directories (transformers imported lazily)."""

from __future__ import annotations

from typing import Any

__all__ = ["validate_hf_policy"]


def validate_hf_policy(policy_cfg: Any) -> None:
    """Check a ``policy=hf`` node before Ray starts (see ``nemo_dp.models.hf.validate``)."""
    from nemo_dp.models.hf.validate import validate_hf_policy as _validate

    _validate(policy_cfg)
