"""``policy.precision`` as the weight dtype a builder uses and the autocast a worker enters.

``32-true``: float32, no autocast; ``bf16-mixed``: float32 weights, forward under bfloat16
autocast (log-softmax and losses outside it, in float32); ``bf16-true``: bfloat16 weights.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from nemo_dp.config.precision import resolve_precision_name
from nemo_dp.models.builders import cfg_get

__all__ = ["Precision", "FULL_PRECISION", "resolve_precision", "bf16_support_problem", "warn_if_no_bf16"]


@dataclass(frozen=True)
class Precision:
    """One ``policy.precision`` value: ``name`` is ``32-true``, ``bf16-mixed`` or ``bf16-true``."""

    name: str

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype of the weights (and so of the optimizer state)."""
        return torch.bfloat16 if self.name == "bf16-true" else torch.float32

    @property
    def mixed(self) -> bool:
        """Whether forwards run under bfloat16 autocast."""
        return self.name == "bf16-mixed"

    @property
    def uses_bf16(self) -> bool:
        """Whether any computation runs in bfloat16."""
        return self.name != "32-true"

    def autocast(self, device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
        """A fresh context for a forward pass on ``device``: bfloat16 autocast for ``bf16-mixed``, else none."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


#: ``32-true``.
FULL_PRECISION = Precision("32-true")


def resolve_precision(policy_cfg: Any) -> Precision:
    """The precision of a ``policy`` node (``policy.precision``, or ``policy.dtype``'s alias).

    Raises:
        ValueError: An illegal value, or both keys set and disagreeing (naming both).
    """
    precision = cfg_get(policy_cfg, "precision", None)
    dtype = cfg_get(policy_cfg, "dtype", None)
    return Precision(
        resolve_precision_name(None if precision is None else str(precision), None if dtype is None else str(dtype))
    )


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def bf16_support_problem(device_type: str) -> str | None:
    """A sentence on why this host cannot run bfloat16 fast on ``device_type`` (``cpu``/``cuda``), or ``None``."""
    if device_type == "cuda":
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
            return f"the CUDA device {torch.cuda.get_device_name()} has no bfloat16 support"
        return None
    flags = _cpu_flags()
    if flags and not flags & {"avx512_bf16", "amx_bf16"}:
        return "the CPU has neither avx512_bf16 nor amx_bf16 (bfloat16 matmuls are emulated, slowly)"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn) backend for bfloat16 matmuls on the CPU"
    return None


def warn_if_no_bf16(precision: Precision, device_type: str) -> None:
    """Warn (naming the precision and what the host lacks) when ``precision`` uses bfloat16 without support.

    ``device_type`` is ``cpu`` or ``cuda``.
    """
    if not precision.uses_bf16:
        return
    problem = bf16_support_problem(device_type)
    if problem is not None:
        warnings.warn(
            f"policy.precision={precision.name}: {problem}; it runs, but expect it to be slower than 32-true",
            RuntimeWarning, stacklevel=2,
        )
