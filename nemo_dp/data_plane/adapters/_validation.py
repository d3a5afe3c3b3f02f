"""Request checks and error messages shared by the data-plane adapters: one wording per error.

torch and tensordict are imported inside functions only: the Ray-store metadata actor starts without them.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.data_plane.schema import RESERVED_PREFIX, TAG_INPUT_LENGTHS
from nemo_dp.utils.checkpoint_io import check_json_value, validate_json_metadata

_MAX_LISTED_IDS = 20

#: Kinds of a put leaf for the adapters that ship tensors and per-row objects apart.
TENSOR_LEAF = "tensor"
OBJECT_LEAF = "object"


# --- names and numbers ------------------------------------------------------------------------
def listed(ids: Collection[str]) -> str:
    """``ids`` sorted, for a message: the first 20 and how many more."""
    ids = sorted(ids)
    shown = ", ".join(repr(i) for i in ids[:_MAX_LISTED_IDS])
    more = len(ids) - _MAX_LISTED_IDS
    return f"[{shown}{f', ... ({more} more)' if more > 0 else ''}]"


def check_name(value: Any, what: str) -> str:
    """``value`` if it is a non-empty str (``TypeError`` / ``ValueError``); ``what`` names it in messages."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__} ({value!r})")
    if not value:
        raise ValueError(f"{what} must be a non-empty str")
    return value


def check_names(values: Any, what: str) -> list[str]:
    """Like :func:`check_name`, for a sequence of names (a bare str is a ``TypeError``)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{what} must be a sequence of str, got {type(values).__name__}")
    out = list(values)
    # fast path in C for the common case (large id lists); the loop below names the culprit
    if set(map(type, out)) <= {str} and "" not in out:
        return out
    return [check_name(v, f"{what} entry") for v in out]


def check_positive_int(value: Any, what: str) -> int:
    """``value`` if it is an int >= 1 (``TypeError`` for a non-int or bool, ``ValueError`` below 1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} ({value!r})")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return value


def duplicates(values: Sequence[str]) -> list[str]:
    """The values that occur more than once, sorted, each once (empty when all are distinct)."""
    if len(set(values)) == len(values):  # fast path for large id lists without repeats
        return []
    return sorted(v for v, count in Counter(values).items() if count > 1)


def _check_unique(values: Sequence[str], what: str) -> None:
    if dups := duplicates(values):
        raise ValueError(f"{what} must be unique; duplicated: {dups}")


def check_partition_id(partition_id: Any) -> str:
    """``partition_id`` if it is a non-empty str outside the reserved prefix (else ``TypeError`` / ``ValueError``)."""
    check_name(partition_id, "partition_id")
    if partition_id.startswith(RESERVED_PREFIX):
        raise ValueError(
            f"partition_id {partition_id!r} is reserved: ids starting with {RESERVED_PREFIX!r} "
            "belong to nemo_dp's own bookkeeping"
        )
    return partition_id


# --- errors about partition state -------------------------------------------------------------
def closed_error(backend: str) -> RuntimeError:
    return RuntimeError(f"{backend} data-plane client is closed.")


def unknown_partition(partition_id: Any) -> KeyError:
    return KeyError(
        f"unknown data-plane partition {partition_id!r} (not registered, or already dropped "
        "with clear_samples(None, ...))"
    )


def already_registered(partition_id: str) -> ValueError:
    return ValueError(
        f"partition {partition_id!r} is already registered; drop it with "
        "clear_samples(None, partition_id) before registering it again"
    )


def unknown_ids(partition_id: str, missing: Collection[str]) -> KeyError:
    return KeyError(
        f"unknown sample ids in partition {partition_id!r} (never written or cleared): "
        f"{listed(missing)}"
    )


def unproduced_fields(
    partition_id: str, unproduced: Sequence[str], produced: Collection[str] | None = None
) -> KeyError:
    known = "" if produced is None else f"; produced: {sorted(produced)}"
    return KeyError(
        f"fields {list(unproduced)} of partition {partition_id!r} are not produced for every "
        f"requested id (never written, or misspelled{known})"
    )


def claim_timeout(partition_id: str, task_name: str, batch_size: int, timeout_s: float) -> TimeoutError:
    return TimeoutError(
        f"claim_meta: fewer than {batch_size} samples of partition {partition_id!r} became ready "
        f"for task {task_name!r} within timeout_s={timeout_s:g}"
    )


# --- registrations ----------------------------------------------------------------------------
@dataclass
class Registration:
    """A checked ``register_partition`` request (fields and tasks in order; ``enums``: field -> vocabulary)."""

    partition_id: str
    fields: list[str]
    tasks: list[str]
    enums: dict[str, tuple[str, ...]]
    num_samples: int
    grpo_group_size: int | None


def check_registration(
    partition_id: str, fields: Any, num_samples: Any, consumer_tasks: Any, grpo_group_size: Any = None,
    enums: Any = None,
) -> Registration:
    """Check a registration's arguments other than the id.

    Raises:
        TypeError: Non-str names, non-int sizes, ``enums`` not a mapping of str sequences.
        ValueError: Duplicate fields, tasks or vocabulary words, ``num_samples < 1``, a group size
            below 1 or not dividing ``num_samples``, an undeclared ``enums`` key.
    """
    field_list = check_names(fields, "fields")
    _check_unique(field_list, "fields")
    task_list = check_names(consumer_tasks, "consumer_tasks")
    _check_unique(task_list, "consumer_tasks")
    check_positive_int(num_samples, "num_samples")
    if grpo_group_size is not None:
        check_positive_int(grpo_group_size, "grpo_group_size")
        if num_samples % grpo_group_size:
            raise ValueError(
                f"grpo_group_size {grpo_group_size} does not divide num_samples {num_samples}"
            )
    if enums is not None and not isinstance(enums, Mapping):
        raise TypeError(f"enums must be a mapping field -> vocabulary, got {type(enums).__name__}")
    enum_map: dict[str, tuple[str, ...]] = {}
    for name, vocab in (enums or {}).items():
        check_name(name, "enums key")
        if name not in field_list:
            raise ValueError(
                f"enums key {name!r} is not a declared field of {partition_id!r} "
                f"(declared: {field_list})"
            )
        words = check_names(vocab, f"enums[{name!r}]")
        _check_unique(words, f"enums[{name!r}] vocabulary")
        enum_map[name] = tuple(words)
    return Registration(partition_id, field_list, task_list, enum_map, num_samples, grpo_group_size)


# --- claims and consumption -------------------------------------------------------------------
def check_task(partition_id: str, registered: Collection[str], task_name: Any) -> str:
    """``task_name`` if it is one of the partition's consumer tasks (else ``KeyError``)."""
    check_name(task_name, "task_name")
    if task_name not in registered:
        raise KeyError(
            f"unknown consumer task {task_name!r} for partition {partition_id!r}; "
            f"registered tasks: {list(registered)}"
        )
    return task_name


def check_consumption_tasks(partition_id: str, registered: Collection[str], task_names: Any) -> list[str]:
    """The tasks of a ``check_consumption_status`` call: ``ValueError`` if none, ``KeyError`` listing unknown ones."""
    tasks = check_names(task_names, "task_names")
    if not tasks:
        raise ValueError("check_consumption_status: task_names must name at least one task")
    if unknown := [t for t in tasks if t not in registered]:
        raise KeyError(
            f"unknown consumer task(s) {unknown} for partition {partition_id!r}; "
            f"registered tasks: {list(registered)}"
        )
    return tasks


def check_claim_request(
    partition_id: str, declared: Collection[str], required_fields: Any, batch_size: Any, timeout_s: Any
) -> list[str]:
    """Check the ``claim_meta`` arguments against the ``declared`` fields; return ``required_fields`` as a list.

    Raises:
        TypeError: Non-str names, non-int ``batch_size``, non-number ``timeout_s``.
        ValueError: No required field, an undeclared one, ``batch_size < 1`` or ``timeout_s <= 0``.
    """
    required = check_names(required_fields, "required_fields")
    if not required:
        raise ValueError("claim_meta: required_fields must name at least one field")
    if undeclared := [f for f in required if f not in declared]:
        raise ValueError(
            f"claim_meta: required_fields {undeclared} are not declared fields of partition "
            f"{partition_id!r} (declared: {list(declared)})"
        )
    check_positive_int(batch_size, "batch_size")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"timeout_s must be a number, got {type(timeout_s).__name__}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    return required


def lengths_from_tags(tags: Sequence[Mapping[str, Any]] | None) -> list[int] | None:
    """Per-row ``input_lengths`` from tags, when every tag holds an int one; else ``None``."""
    if not tags or any(TAG_INPUT_LENGTHS not in t for t in tags):
        return None
    values = [t[TAG_INPUT_LENGTHS] for t in tags]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        return None
    return [int(v) for v in values]


def int_lengths(column: Any) -> list[int] | None:
    """The values of a dense 1-D integer tensor as ints; ``None`` for anything else."""
    import torch

    if not isinstance(column, torch.Tensor) or column.is_nested or column.dim() != 1:
        return None
    if column.is_floating_point() or column.is_complex() or column.dtype == torch.bool:
        return None
    return column.tolist()


def put_receipt(
    partition_id: str, ids: Sequence[str], fields: list[str] | None, column: Any,
    tags: Sequence[Mapping[str, Any]] | None, extra_info: dict[str, Any] | None = None,
) -> KVBatchMeta:
    """The receipt a put returns: a ``KVBatchMeta`` with no task (``fields`` ``None`` for a tags-only put).

    ``column`` is the ``input_lengths`` column written, if any; its :func:`int_lengths` give the
    receipt's ``sequence_lengths``, else the tags' do.  ``tags`` are deep-copied into the receipt.
    """
    lengths = int_lengths(column)
    if lengths is None:
        lengths = lengths_from_tags(tags)
    return KVBatchMeta(
        partition_id,
        None,
        list(ids),
        fields=fields,
        sequence_lengths=lengths,
        extra_info=extra_info or {},
        tags=copy.deepcopy(tags),
    )


# --- reads and clears -------------------------------------------------------------------------
def check_meta(meta: Any) -> KVBatchMeta:
    if not isinstance(meta, KVBatchMeta):
        raise TypeError(f"get_data needs a KVBatchMeta, got {type(meta).__name__}")
    return meta


def get_data_fields(meta: KVBatchMeta, select_fields: Sequence[str] | None) -> list[str]:
    """``get_data``'s fields: non-empty ``select_fields``, else ``meta.fields`` (neither: ``ValueError``)."""
    if select_fields is not None and len(list(select_fields)) > 0:
        return list(select_fields)
    if meta.fields:
        return list(meta.fields)
    raise ValueError(
        "get_data: neither select_fields nor meta.fields names a field to fetch "
        "(fetching all fields silently is forbidden)"
    )


def check_read_args(sample_ids: Any, select_fields: Any) -> tuple[list[str], list[str]]:
    """``(ids, fields)`` of a read; ``ValueError`` for no or duplicate fields or duplicate ids."""
    fields = [] if select_fields is None else check_names(select_fields, "select_fields")
    if not fields:
        raise ValueError("get_samples needs a non-empty select_fields (no 'fetch everything')")
    _check_unique(fields, "select_fields")
    ids = check_names(sample_ids, "sample_ids")
    if dups := duplicates(ids):
        raise ValueError(f"duplicate sample ids in one get: {listed(dups)}")
    return ids, fields


def check_clear_ids(sample_ids: Any) -> list[str]:
    """The explicit ids of a ``clear_samples`` call (``ValueError`` listing duplicates)."""
    ids = check_names(sample_ids, "sample_ids")
    if dups := duplicates(ids):
        raise ValueError(f"duplicate sample ids in one clear: {listed(dups)}")
    return ids


# --- puts -------------------------------------------------------------------------------------
@dataclass
class PutArgs:
    """A put's arguments checked without the partition (``names`` in the TensorDict's order; tags detached)."""

    ids: list[str]
    names: list[str]
    tags: list[dict[str, Any]] | None


def check_put_args(
    partition_id: str, sample_ids: Any, fields: Any, tags: Any, *, exact_tags: bool = False,
    allow_no_columns: bool = False,
) -> PutArgs:
    """Validate a put's ids, fields (a ``TensorDict`` or ``None``) and tags (one dict per id).

    ``exact_tags`` keeps tags as deep copies (non-finite floats allowed) instead of JSON-normalising
    them; ``allow_no_columns`` accepts a ``fields`` without columns and no tags.

    Raises:
        ValueError: Neither fields nor tags, duplicate ids, a batch size or tags length other than
            the ids', a tags-less put of a TensorDict without columns.
        TypeError: Non-str ids, fields not a TensorDict, tags not a sequence of JSON-compatible dicts.
    """
    from tensordict import TensorDictBase

    ids = check_names(sample_ids, "sample_ids")
    if fields is None and tags is None:
        raise ValueError("put_samples needs fields or tags (got neither)")
    if dups := duplicates(ids):
        raise ValueError(f"duplicate sample ids in one put to {partition_id!r}: {listed(dups)}")
    n = len(ids)
    names: list[str] = []
    if fields is not None:
        if not isinstance(fields, TensorDictBase):
            raise TypeError(f"put_samples: fields must be a TensorDict, got {type(fields).__name__}")
        if fields.batch_dims != 1 or fields.batch_size[0] != n:
            raise ValueError(
                f"put_samples: fields batch_size {tuple(fields.batch_size)} does not match {n} "
                f"sample ids (expected ({n},))"
            )
        names = list(fields.keys())
    tag_list: list[dict[str, Any]] | None = None
    if tags is not None:
        if isinstance(tags, (str, bytes, Mapping)) or not isinstance(tags, Sequence):
            raise TypeError(f"put_samples: tags must be a sequence of dicts, got {type(tags).__name__}")
        if len(tags) != n:
            raise ValueError(f"put_samples: tags has {len(tags)} entries for {n} sample ids")
        tag_list = []
        for i, t in enumerate(tags):
            if not isinstance(t, Mapping):
                raise TypeError(f"put_samples: tags[{i}] must be a dict, got {type(t).__name__}")
            if exact_tags:
                check_json_value(t, f"put_samples: tags[{i}]", finite=False)
                tag_list.append(copy.deepcopy(dict(t)))
                continue
            try:
                tag_list.append(validate_json_metadata(t))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"put_samples: tags[{i}] is not JSON-compatible: {exc}") from exc
    if fields is not None and not names and tag_list is None and not allow_no_columns:
        raise ValueError("put_samples needs fields or tags (fields has no columns)")
    return PutArgs(ids, names, tag_list)


def wire_leaf_kind(name: str, leaf: Any, n: int) -> str:
    """:data:`TENSOR_LEAF` or :data:`OBJECT_LEAF` for a leaf that ships one value per row.

    Raises:
        TypeError: A whole-column ``NonTensorData``, a nested ``TensorDict`` or another type.
        ValueError: A ``NonTensorStack`` of other than ``n`` rows.
    """
    import torch
    from tensordict import NonTensorData, NonTensorStack, TensorDictBase

    if isinstance(leaf, NonTensorStack):
        if len(leaf) != n:
            raise ValueError(f"field {name!r}: non-tensor column has {len(leaf)} rows, expected {n}")
        return OBJECT_LEAF
    if isinstance(leaf, NonTensorData):
        raise TypeError(
            f"field {name!r} is a NonTensorData (one non-tensor object for the whole column); "
            "this store keeps one value per row - use a per-row NonTensorStack "
            "(pack_jagged_fields builds one)"
        )
    if isinstance(leaf, TensorDictBase):
        raise TypeError(
            f"field {name!r} is a nested TensorDict; only tensors and per-row NonTensorStack "
            "columns are fields"
        )
    if isinstance(leaf, torch.Tensor):
        return TENSOR_LEAF
    raise TypeError(f"field {name!r} has unsupported type {type(leaf).__name__}")


def check_undeclared(partition_id: str, names: Sequence[str], declared: Collection[str]) -> None:
    """``ValueError`` naming every put field the partition did not declare."""
    if undeclared := [k for k in names if k not in declared]:
        raise ValueError(
            f"put_samples: fields {undeclared} are not declared for partition "
            f"{partition_id!r} (declared: {list(declared)})"
        )


def kind_changed(partition_id: str, name: str, stored: str, got: str) -> TypeError:
    return TypeError(
        f"put_samples: field {name!r} of partition {partition_id!r} is stored as {stored}, this "
        f"put has {got}; a field's kind and dtype cannot change"
    )


def check_enum_put(
    name: str, vocab: Sequence[str], values: Sequence[Any] | None, kind: str, tensor_error: type[Exception] = ValueError
) -> None:
    """Check one put column (``values`` per row, ``None`` for a tensor of ``kind``) of the enum field ``name``.

    Raises:
        tensor_error: A tensor column.
        ValueError: A value outside the vocabulary.
    """
    if values is None:
        raise tensor_error(
            f"put_samples: field {name!r} takes values from its enum vocabulary {list(vocab)}, "
            f"got a tensor column ({kind})"
        )
    for value in values:
        if not isinstance(value, str) or value not in vocab:
            raise ValueError(
                f"put_samples: field {name!r} value {value!r} is not in its declared enum "
                f"vocabulary {list(vocab)}"
            )
