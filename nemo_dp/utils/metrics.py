"""Per-step metrics as JSON lines: the record a run leaves for plots, tests and comparisons."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nemo_dp.utils.json_files import json_lines, write_json_lines


def _to_json_number(key: str, value: Any) -> float | int | str | bool | None:
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if torch is not None and isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"MetricsLogger: metric {key!r} is a tensor of {value.numel()} elements, need 1")
        value = value.item()
    if hasattr(value, "item") and not isinstance(value, (int, float, str, bool)):
        value = value.item()  # numpy scalars
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        # JSON has no NaN/inf; keep the record valid and the fact visible.
        return value if math.isfinite(value) else str(value)
    raise TypeError(f"MetricsLogger: metric {key!r} has type {type(value).__name__}, need a number")


class MetricsLogger:
    """Appends one JSON object per call to a ``metrics.jsonl`` file (appending to an existing one)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Append the record ``{"step": step, **metrics}`` of scalars, flush it to disk and return it.

        Raises:
            ValueError: ``metrics`` contains ``"step"`` or a multi-element tensor.
            TypeError: A value is not a scalar.
        """
        if "step" in metrics:
            raise ValueError("MetricsLogger.log: metrics must not contain the reserved key 'step'")
        record = {"step": int(step), **{str(k): _to_json_number(str(k), v) for k, v in metrics.items()}}
        line = json.dumps(record)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
        return record

    def truncate_after(self, step: int) -> None:
        """Drop records whose step is greater than ``step`` (resume from a checkpoint)."""
        if not self.path.exists():
            return
        write_json_lines(self.path, [r for r in read_metrics(self.path) if r["step"] <= step])


def bad_metrics_json(path: str | os.PathLike[str], lineno: int, exc: Exception) -> ValueError:
    """The error for line ``lineno`` of a metrics file that is not JSON."""
    return ValueError(f"{path}:{lineno}: invalid JSON in metrics file: {exc}")


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a metrics jsonl file (``ValueError`` naming the line that is no object with an int ``step``)."""
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, rec in json_lines(fh, lambda n, exc: bad_metrics_json(path, n, exc)):
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                raise ValueError(f"{path}:{lineno}: metrics record needs an int 'step'")
            records.append(rec)
    return records
