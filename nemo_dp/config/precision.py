"""The ``policy.precision`` names and their ``policy.dtype`` aliases.

It imports no schema, so the model layer can resolve a precision without loading them.
"""

from __future__ import annotations

from typing import Optional

from nemo_dp.utils.config_checks import one_of

__all__ = ["PRECISION_NAMES", "DEFAULT_PRECISION", "DTYPE_PRECISIONS", "HF_DTYPE_NAMES", "resolve_precision_name"]


#: ``policy.precision`` values (Lightning's names): float32 throughout; float32 master weights
#: and optimizer state with the forward and backward under bfloat16 autocast; bfloat16 weights.
PRECISION_NAMES: tuple[str, ...] = ("32-true", "bf16-mixed", "bf16-true")
#: The precision of a node that sets neither ``policy.precision`` nor ``policy.dtype``.
DEFAULT_PRECISION = "32-true"
#: ``policy.dtype`` (the older key, kept as an alias) -> the precision it names.
DTYPE_PRECISIONS: dict[str, str] = {"float32": "32-true", "bfloat16": "bf16-true"}
#: Legal ``policy.dtype`` values.
HF_DTYPE_NAMES: tuple[str, ...] = tuple(DTYPE_PRECISIONS)


def resolve_precision_name(precision: Optional[str], dtype: Optional[str]) -> str:
    """The one of :data:`PRECISION_NAMES` that ``policy.precision`` / ``policy.dtype`` select.

    Either may be ``None`` (not set); :data:`DEFAULT_PRECISION` when neither is set.

    Raises:
        ValueError: An illegal value (naming the key and the legal values), or both keys set
            to different precisions (naming both).
    """
    if dtype is not None:
        one_of("policy.dtype", dtype, tuple(DTYPE_PRECISIONS))
    if precision is not None:
        one_of("policy.precision", precision, PRECISION_NAMES)
    if precision is not None and dtype is not None and DTYPE_PRECISIONS[dtype] != precision:
        raise ValueError(
            f"policy.precision={precision} and policy.dtype={dtype} (an alias of "
            f"policy.precision={DTYPE_PRECISIONS[dtype]}) disagree; set only policy.precision"
        )
    if precision is not None:
        return precision
    return DTYPE_PRECISIONS[dtype] if dtype is not None else DEFAULT_PRECISION
