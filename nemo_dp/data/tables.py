"""A user's dataset opened through the ``datasets`` library, checked once, read lazily.

Accepts jsonl/json/parquet/csv files, globs, or a ``save_to_disk`` directory (``env.split``).
Every row is checked with the jsonl reader's rules (jsonl errors name file:line, others the row
index).  Opened tables are cached per process, keyed by paths, sizes and mtimes.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from nemo_dp.data.columns import Columns
from nemo_dp.data.errors import DatasetError
from nemo_dp.data.jsonl import (
    RowFields, nonblank_lines, read_rl_jsonl, read_sft_jsonl, rl_fields, scan_jsonl, sft_example,
)

__all__ = ["Table", "open_table", "check_rows", "row_fields", "FORMATS"]

#: File suffixes and the ``datasets`` builder that reads them.
FORMATS: dict[str, str] = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_BATCH = 2048
# Opened datasets by (path, split, file stats): (dataset, lines, checked, memo), shared by every
# key that names the same files (a train set that is also the held-out set is parsed once).
_CACHE: dict[tuple[Any, ...], tuple[Any, Optional[list[int]], set[Any], dict[Any, Any]]] = {}
_CACHE_SIZE = 16


@dataclass
class Table:
    """One opened dataset.

    Attributes:
        key: The config key that named it.
        path: What the key holds (a file, a glob or a directory), for messages.
        dataset: The ``datasets.Dataset`` (memory-mapped Arrow).
        lines: For a single jsonl file, the 1-based line of each row; None otherwise.
        checked: The ``(kind, columns)`` pairs whose rows passed ``check_rows``.
        memo: Per-tokenizer results computed from the rows (token lengths), computed once per
            process.  ``checked`` and ``memo`` are shared by every key naming the same files.
    """

    key: str
    path: str
    dataset: Any
    lines: Optional[list[int]] = None
    checked: set[tuple[str, Columns]] = field(default_factory=set)
    memo: dict[Any, Any] = field(default_factory=dict)

    @property
    def column_names(self) -> list[str]:
        return list(self.dataset.column_names)

    def __len__(self) -> int:
        return int(self.dataset.num_rows)

    def locate(self, i: int) -> dict[str, Optional[int]]:
        """Where row ``i`` is, as ``DatasetError`` keywords (``line`` or ``row``)."""
        if self.lines is not None:
            return {"line": self.lines[i], "row": None}
        return {"line": None, "row": i}

    def fields(self, i: int, row: dict[str, Any]) -> RowFields:
        """Field access on row ``i`` (``row`` its values; nulls count as absent)."""
        obj = {k: v for k, v in row.items() if v is not None}
        where = self.locate(i)
        return RowFields(obj, self.path, where["line"], self.key, row=where["row"])

    def column_values(self, name: str, stop: Optional[int] = None) -> Iterator[Any]:
        """The values of one column, rows ``0 .. stop-1``, read straight from Arrow in batches."""
        n = len(self) if stop is None else min(stop, len(self))
        arrow = self.dataset.select_columns([name]).with_format("arrow")
        for start in range(0, n, _BATCH):
            yield from arrow[start : min(start + _BATCH, n)].column(name).to_pylist()

    def iter_rows(self, stop: Optional[int] = None, columns: Optional[list[str]] = None) -> Iterator[dict[str, Any]]:
        """``{column: value}`` for rows ``0 .. stop-1`` in order, read in batches (default: all rows, all columns)."""
        ds = self.dataset if columns is None else self.dataset.select_columns(columns)
        n = len(self) if stop is None else min(stop, len(self))
        for start in range(0, n, _BATCH):
            batch = ds[start : min(start + _BATCH, n)]
            names = list(batch)
            for values in zip(*(batch[c] for c in names)):
                yield dict(zip(names, values))


def _quiet() -> Any:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _files(spec: str, key: str) -> list[str]:
    if any(ch in spec for ch in "*?["):
        files = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
        if not files:
            raise DatasetError("the pattern matches no file", key=key, path=spec, fix="check the path and the pattern")
        return files
    if not os.path.exists(spec):
        raise DatasetError(
            "file does not exist", key=key, path=spec, fix="point it at an existing jsonl, json, parquet or csv "
            "file, a glob of them, or a directory written by Dataset.save_to_disk"
        )
    return [spec]


def _builder(files: list[str], spec: str, key: str) -> str:
    suffixes = {Path(f).suffix.lower() for f in files}
    unknown = sorted(s or "(none)" for s in suffixes if s not in FORMATS)
    if unknown:
        raise DatasetError(
            f"has no readable format (suffix {', '.join(unknown)}); legal suffixes: {list(FORMATS)}",
            key=key,
            path=spec,
        )
    builders = {FORMATS[s] for s in suffixes}
    if len(builders) > 1:
        raise DatasetError(f"mixes formats {sorted(suffixes)}; give files of one format", key=key, path=spec)
    return builders.pop()


def _saved(spec: str, key: str, split: Optional[str]) -> Any:
    datasets = _quiet()
    root = Path(spec)
    if not ((root / "dataset_info.json").is_file() or (root / "dataset_dict.json").is_file()):
        raise DatasetError(
            "is a directory but not one written by Dataset.save_to_disk (no dataset_info.json or "
            "dataset_dict.json)",
            key=key,
            path=spec,
            fix="point it at a data file, a glob of files, or a saved dataset",
        )
    try:
        loaded = datasets.load_from_disk(spec)
    except Exception as exc:  # the library's own errors for a damaged directory
        raise DatasetError(f"cannot be loaded as a saved dataset: {exc}", key=key, path=spec) from exc
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if split is None:
            if len(splits) == 1:
                return loaded[splits[0]]
            raise DatasetError(
                f"holds a DatasetDict with splits {splits}; choose one", key=key, path=spec, fix="set env.split"
            )
        if split not in loaded:
            raise DatasetError(f"has no split {split!r}; splits: {splits}", key="env.split", path=spec)
        return loaded[split]
    if split is not None:
        raise DatasetError(f"holds one Dataset, not a DatasetDict; env.split={split!r} does not apply", key=key, path=spec)
    return loaded


def _no_rows(files: list[str], builder: str) -> bool:
    if builder == "parquet":
        import pyarrow.parquet as pq

        return all(pq.read_metadata(f).num_rows == 0 for f in files)
    return all(os.path.getsize(f) == 0 for f in files)


def _csv_as_text(path: str, datasets: Any) -> dict[str, Any]:
    """Read every csv column as text (no number guessing, an empty cell stays ``""``).

    A prompt "12" stays a prompt, and answers are compared as the text the file holds.
    """
    import csv

    with open(path, newline="", encoding="utf-8-sig") as fh:
        header = next(csv.reader(fh), None)
    if not header:
        return {}
    features = datasets.Features({name: datasets.Value("string") for name in header})
    return {"features": features, "keep_default_na": False}


def _load_files(files: list[str], spec: str, key: str, strict: Callable[[str], Any]) -> Any:
    datasets = _quiet()
    builder = _builder(files, spec, key)
    kwargs: dict[str, Any] = {}
    if builder == "csv":
        kwargs = _csv_as_text(files[0], datasets)
    try:
        return datasets.load_dataset(builder, data_files=files, split="train", **kwargs)
    except Exception as exc:
        if _no_rows(files, builder):
            raise DatasetError("no records", key=key, path=spec, fix="the dataset holds no rows") from None
        if builder == "json":
            for f in files:
                if f.lower().endswith(".jsonl"):
                    scan_jsonl(f, key=key)  # a line that is no JSON object: its file:line
                    strict(f)  # a field of the wrong type: its file:line and field
        cause = exc.__cause__ or exc
        raise DatasetError(f"cannot be read as {builder}: {cause}", key=key, path=spec) from exc


def _stat_key(files: list[str]) -> tuple[Any, ...]:
    out = []
    for f in files:
        st = os.stat(f)
        out.append((os.path.abspath(f), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _dir_stat(spec: str) -> tuple[Any, ...]:
    return _stat_key(sorted(str(p) for p in Path(spec).rglob("*") if p.is_file()))


def open_table(
    spec: str, *, key: str, split: Optional[str] = None, strict: Optional[Callable[[str], Any]] = None
) -> Table:
    """Open the dataset ``spec`` names (parsed once per process while the files are unchanged).

    Args:
        spec: A file, a glob, or a ``save_to_disk`` directory.
        key: The config key holding ``spec`` (named in errors).
        split: The split of a saved ``DatasetDict`` (``env.split``).
        strict: Reads a jsonl file that the library cannot, raising its fault by file:line
            (the jsonl reader for the dataset's kind and columns).

    Raises:
        DatasetError: A missing file, an unknown format, an unreadable file (a jsonl file's
            fault named by file:line), a directory that is no saved dataset, a missing split, or
            a table without rows.
    """
    is_dir = os.path.isdir(spec)
    files = [] if is_dir else _files(spec, key)
    cache_key = (os.path.abspath(spec), split, _dir_stat(spec) if is_dir else _stat_key(files))
    hit = _CACHE.get(cache_key)
    if hit is not None:
        dataset, lines, checked, memo = hit
        return Table(key=key, path=spec, dataset=dataset, lines=lines, checked=checked, memo=memo)

    if is_dir:
        dataset = _saved(spec, key, split)
    else:
        if split is not None:
            raise DatasetError(f"env.split={split!r} applies only to a saved DatasetDict directory", key=key, path=spec)
        dataset = _load_files(files, spec, key, strict or (lambda path: None))
    lines = None
    if len(files) == 1 and files[0].lower().endswith(".jsonl"):
        lines = nonblank_lines(files[0])
        if len(lines) != dataset.num_rows:  # the library and the line reader disagree: trust neither
            raise DatasetError(
                f"holds {len(lines)} non-blank lines but the datasets library read {dataset.num_rows} rows",
                key=key,
                path=spec,
            )
    table = Table(key=key, path=spec, dataset=dataset, lines=lines)
    if len(table) == 0:
        raise DatasetError("no records", key=key, path=spec, fix="the dataset holds no rows")
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[cache_key] = (dataset, lines, table.checked, table.memo)
    return table


def _need(table: Table, names: Sequence[str], setting: Sequence[str]) -> None:
    found = table.column_names
    for name, key in zip(names, setting):
        if name not in found:
            raise DatasetError(
                f"has no column {name!r} (columns: {found})",
                key=table.key,
                path=table.path,
                fix=f"set {key} to the column that holds it",
            )


def _typed_and_full(table: Table, kind: str, col: Columns) -> bool:
    """Whether the column types alone prove every row good (text columns without conversations).

    A string column without nulls or blank values, and an answer column of strings or integers
    without nulls, pass the row rules by type, checked in Arrow without a Python loop.  Anything
    else goes row by row (and names the row at fault).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if col.messages in table.column_names:
        return False
    data = table.dataset.with_format("arrow")[:]  # the rows as one (memory-mapped) Arrow table
    texts = [col.prompt, col.response] if kind == "sft" else [col.prompt]
    for name in texts:
        column = data.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) or column.null_count:
            return False
        if pc.any(pc.equal(pc.utf8_trim_whitespace(column), "")).as_py():
            return False
    if kind == "rl":
        answer = data.column(col.answer)
        typed = pa.types.is_string(answer.type) or pa.types.is_large_string(answer.type) or pa.types.is_integer(answer.type)
        if not typed or answer.null_count:
            return False
    return True


def check_rows(table: Table, kind: str, col: Columns) -> None:
    """Check every row of ``table`` for ``kind`` (``"sft"`` or ``"rl"``), once per table.

    ``"sft"`` needs ``prompt`` + ``response`` or ``messages`` ending with the assistant; ``"rl"``
    needs ``prompt`` or ``messages`` (not ending with the assistant) + ``answer``.

    Raises:
        DatasetError: A missing column (naming the columns found and the ``env.columns`` key to
            set) or a bad row (naming its file:line for jsonl, else its row index, and the column).
    """
    if (kind, col) in table.checked:
        return
    found = table.column_names
    if col.prompt not in found and col.messages not in found:
        raise DatasetError(
            f"has neither column {col.prompt!r} nor {col.messages!r} (columns: {found})",
            key=table.key,
            path=table.path,
            fix="set env.columns.prompt (text prompts) or env.columns.messages (conversations)",
        )
    if kind == "rl":
        _need(table, [col.answer], ["env.columns.answer"])
    elif col.prompt in found:
        _need(table, [col.response], ["env.columns.response"])
    if _typed_and_full(table, kind, col):
        table.checked.add((kind, col))
        return
    wanted = [c for c in col.reserved() if c in found]
    for i, row in enumerate(table.iter_rows(columns=wanted)):
        fields = table.fields(i, row)
        try:
            if kind == "rl":
                rl_fields(fields, col)
            else:
                sft_example(fields, col)
        except DatasetError:
            if table.lines is not None:  # the jsonl reader names the very line and field
                (read_rl_jsonl if kind == "rl" else read_sft_jsonl)(table.path, key=table.key, columns=col)
            raise
    table.checked.add((kind, col))


def row_fields(table: Table, i: int) -> tuple[RowFields, dict[str, Any]]:
    """Row ``i`` of ``table`` as ``(field access, all its values)``."""
    row = table.dataset[int(i)]
    return table.fields(int(i), row), row
