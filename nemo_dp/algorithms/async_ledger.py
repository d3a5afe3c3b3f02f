"""Per-step record of the prompts asynchronous GRPO trained (``async_ledger.jsonl``), to check exactly-once."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["LEDGER_FILE", "AsyncLedger", "read_ledger"]

LEDGER_FILE = "async_ledger.jsonl"


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """The ledger's records in file order (``[]`` when the file does not exist).

    Raises:
        ValueError: A line is not a JSON object (names the file and line number).
    """
    p = Path(path)
    if not p.exists():
        return []
    out: list[dict[str, Any]] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}:{n}: not a JSON line: {exc}") from exc
        if not isinstance(rec, dict) or "step" not in rec:
            raise ValueError(f"{p}:{n}: expected an object with a 'step' key")
        out.append(rec)
    return out


class AsyncLedger:
    """Appends trained-step records to ``<out_dir>/async_ledger.jsonl`` (``out_dir``: the phase's)."""

    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir) / LEDGER_FILE

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after the resumed ``step`` (a resumed run redoes them; 0 empties the file)."""
        kept = [r for r in read_ledger(self.path) if int(r["step"]) <= step]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")

    def append(self, step: int, *, epoch: int, indices: Sequence[int], sample_ids: Sequence[str], version: int) -> None:
        """Record one trained step (``indices``: dataset indices; ``version``: the generating policy's)."""
        rec = {
            "step": int(step),
            "epoch": int(epoch),
            "indices": [int(i) for i in indices],
            "sample_ids": [str(s) for s in sample_ids],
            "generated_with_version": int(version),
        }
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
