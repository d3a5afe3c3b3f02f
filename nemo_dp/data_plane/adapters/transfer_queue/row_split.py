"""The storage-side half of the row-bytes wire layout: :func:`split_rows`, a put's ``data_parser``.

Shipped by value, so it imports only the standard library at module level: storage units lack nemo_dp.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Bytes of a padded row's length (little-endian int64) at the start of its header.
LENGTH_BYTES = 8


def split_rows(fields: dict[str, Any], *, columns: Mapping[str, tuple[bytes, int]]) -> dict[str, Any]:
    """Turn each encoded column of a put into one ``bytes`` value per row (the rest pass through).

    Args:
        columns: Field -> ``(descriptor, header)`` of a 2-D row matrix; ``descriptor`` prefixes every
            stored row.  ``header > 0``: each matrix row starts with ``header`` bytes whose first
            :data:`LENGTH_BYTES` give the number of data bytes that follow (the rest is padding).

    Raises:
        ValueError: An encoded column is not a 2-D tensor, or a row's length exceeds its row.
    """
    import torch  # present on every storage unit (the library depends on it)

    out = dict(fields)
    join = b"".join
    for name, (descriptor, header) in columns.items():
        matrix = fields[name]
        if not isinstance(matrix, torch.Tensor) or matrix.dim() != 2:
            raise ValueError(f"row layout: column {name!r} is not a 2-D tensor")
        raw = matrix.contiguous().view(torch.uint8)
        rows, width = int(raw.shape[0]), int(raw.shape[1])
        view = memoryview(raw.numpy()).cast("B")
        values: list[bytes] = []
        if header:
            room = width - header
            for i in range(rows):
                start = i * width
                n = int.from_bytes(view[start : start + LENGTH_BYTES], "little")
                if n > room:
                    raise ValueError(
                        f"row layout: column {name!r} row {i} claims {n} bytes in a {room}-byte row"
                    )
                data = start + header
                values.append(join((descriptor, view[data : data + n])))
        else:
            for i in range(rows):
                start = i * width
                values.append(join((descriptor, view[start : start + width])))
        out[name] = values
    return out
