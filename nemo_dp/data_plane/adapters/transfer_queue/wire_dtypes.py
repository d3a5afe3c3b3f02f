"""The stable one-byte codes of the tensor dtypes the TransferQueue adapter's row layouts carry.

Shared by the tensor-column row layout (``row_wire``) and the per-sample object-row layout
(``object_rows``); a code written into a stored row is never renumbered.
"""

from __future__ import annotations

import torch

__all__ = ["DTYPE_CODES", "DTYPES_BY_CODE"]

#: Tensor dtypes the row layouts carry, by a stable one-byte code (never renumber).
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.bool: 1,
    torch.uint8: 2,
    torch.int8: 3,
    torch.int16: 4,
    torch.int32: 5,
    torch.int64: 6,
    torch.float16: 7,
    torch.bfloat16: 8,
    torch.float32: 9,
    torch.float64: 10,
    torch.complex64: 11,
    torch.complex128: 12,
}
DTYPES_BY_CODE: dict[int, torch.dtype] = {code: dtype for dtype, code in DTYPE_CODES.items()}
