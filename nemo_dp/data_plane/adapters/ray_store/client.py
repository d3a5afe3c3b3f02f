"""``RayStoreClient``: the data-plane contract over Ray's object store plus one metadata actor.

A put ``ray.put``s one object holding each of its tensor columns once and registers it with the
actor, which checks the schema before it commits; a read asks the actor where its cells live,
fetches the chunks with one ``ray.get`` and gathers its rows locally.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from tensordict import NonTensorStack, TensorDict

from nemo_dp.data_plane.adapters._base import BaseDataPlaneClient, coerce_dataclass_config
from nemo_dp.data_plane.adapters._validation import (
    TENSOR_LEAF,
    check_put_args,
    put_receipt,
    unknown_partition,
    wire_leaf_kind,
)
from nemo_dp.data_plane.adapters.ray_store.actor import attach_actor, create_actor, kill_actor
from nemo_dp.data_plane.adapters.ray_store.checkpoint import RayStoreCheckpointMixin
from nemo_dp.data_plane.adapters.ray_store.columns import Segment, dtype_from_name, encode_column, gather_field
from nemo_dp.data_plane.adapters.ray_store.state import OBJECT, InlinePayload, TensorColumnSpec
from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError, KVBatchMeta
from nemo_dp.data_plane.ray_store_config import RayStoreDataPlaneConfig
from nemo_dp.data_plane.schema import INPUT_LENGTHS

__all__ = ["INLINE_MAX_BYTES", "RayStoreClient", "build_ray_store_client"]

#: A put whose tensor columns hold at most this many bytes in all skips the object store: its
#: columns travel in, and live in, the metadata actor (``InlinePayload``) and come back in a read's
#: ``locate`` reply.  Below Ray's own inlining limit for task arguments (100 KiB).
INLINE_MAX_BYTES = 64 * 1024

_ERRORS: dict[str, type[Exception]] = {e.__name__: e for e in (KeyError, ValueError, TypeError, RuntimeError)}


def _listed(values: Any) -> Any:
    """A list or tuple as a list for the actor call; anything else as given (the actor rejects it)."""
    return list(values) if isinstance(values, (list, tuple)) else values


class RayStoreClient(RayStoreCheckpointMixin, BaseDataPlaneClient):
    """The data-plane contract over Ray's object store.

    Thread-safe.  Rows stay readable while the process that wrote them lives (Ray has no ownership
    transfer); a read of rows whose writer has exited raises ``DataPlaneUnavailableError``.

    Args:
        bootstrap: ``True`` (the driver) creates the metadata actor and kills it on close;
            ``False`` finds the running one.
        checkpointing: Ignored: every bootstrapping client can checkpoint.

    Raises:
        RuntimeError: Ray is not running; the actor already exists (bootstrap) or does not
            (attach), or did not answer within ``timeouts.startup_s``.
    """

    def __init__(self, cfg: Any, *, bootstrap: bool = True, checkpointing: bool = False) -> None:
        del checkpointing
        self._cfg = coerce_dataclass_config(cfg, RayStoreDataPlaneConfig, "RayStoreClient")
        self._init_lifetime(bootstrap, closed=True)  # open once the actor answered
        self._close_lock = threading.Lock()
        t = self._cfg.timeouts
        self._actor_s = float(t.actor_s)
        self._data_s = float(t.data_s)
        self._poll_s = float(self._cfg.claim_meta_poll_interval_s)
        self._actor = (create_actor if self._bootstrap else attach_actor)(float(t.startup_s))
        self._closed = False

    BACKEND = "ray_store"

    def _call(self, op: str, partition_id: Any, *args: Any) -> Any:
        """One metadata-actor call (``DataPlaneUnavailableError`` past ``timeouts.actor_s`` or if it is dead)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        self._check_open()
        try:
            reply = ray.get(self._actor.call.remote(op, *args), timeout=self._actor_s)
        except GetTimeoutError as exc:
            raise DataPlaneUnavailableError(
                f"ray_store {op} on partition {partition_id!r}: the metadata actor gave no "
                f"answer within data_plane.timeouts.actor_s={self._actor_s:g}s (treat the step "
                "as failed)"
            ) from exc
        except RayActorError as exc:
            raise DataPlaneUnavailableError(
                f"ray_store {op} on partition {partition_id!r}: the metadata actor is dead "
                f"({type(exc).__name__}); the data plane is gone"
            ) from exc
        if reply[0]:
            return reply[1]
        raise _ERRORS.get(reply[1], RuntimeError)(reply[2])

    def _require_known(self, partition_id: Any) -> None:
        if not self._call("exists", partition_id, partition_id):
            raise unknown_partition(partition_id)

    def _fetch(self, refs: list[Any], partition_id: str, op: str) -> list[Any]:
        import ray
        from ray.exceptions import GetTimeoutError, ObjectLostError

        try:
            return ray.get(refs, timeout=self._data_s)
        except GetTimeoutError as exc:
            raise DataPlaneUnavailableError(
                f"ray_store {op} on partition {partition_id!r}: the object store did not "
                f"deliver the columns within data_plane.timeouts.data_s={self._data_s:g}s"
            ) from exc
        except ObjectLostError as exc:
            raise DataPlaneUnavailableError(
                f"ray_store {op} on partition {partition_id!r}: a column object is lost "
                f"({type(exc).__name__}; the process that wrote it has probably exited)"
            ) from exc

    def _chunk_payloads(
        self, chunks: Mapping[int, tuple[Any, str, str, str]], partition_id: str, op: str
    ) -> dict[int, Any]:
        """chunk id -> its column payload, fetching every distinct object once (inline chunks are not fetched)."""
        objects: dict[Any, int] = {}
        for ref, *_ in chunks.values():
            if not isinstance(ref, InlinePayload):
                objects.setdefault(ref, len(objects))
        fetched = self._fetch(list(objects), partition_id, op) if objects else []
        return {
            cid: ref.payload[key] if isinstance(ref, InlinePayload) else fetched[objects[ref]][key]
            for cid, (ref, key, *_) in chunks.items()
        }

    def _register(self, partition_id: Any, fields: Any, n: Any, tasks: Any, group_size: Any, enums: Any) -> None:
        self._begin()
        enum_map = None if enums is None else {k: list(v) for k, v in dict(enums).items()}
        args = (_listed(fields), n, _listed(tasks), group_size, enum_map)
        self._call("register", partition_id, partition_id, *args)

    def _claim(
        self, partition_id: Any, task_name: Any, fields: Any, n: Any, blocking: bool, timeout_s: Any
    ) -> KVBatchMeta:
        self._begin()
        fields = _listed(fields)

        def attempt() -> Any:
            return self._call("claim", partition_id, partition_id, task_name, fields, n, timeout_s)

        return self._poll_claim(attempt, partition_id, task_name, fields, n, blocking, timeout_s)

    def _consumed(self, partition_id: Any, task_names: Any) -> bool:
        self._begin()
        return bool(self._call("consumed", partition_id, partition_id, _listed(task_names)))

    def _put(self, sample_ids: Any, partition_id: Any, fields: Any, tags: Any) -> KVBatchMeta:
        """Write (upsert) rows; a put the actor rejects leaves no trace (its objects are freed with their refs)."""
        import ray

        self._begin()
        tensors: dict[str, Any] = {}
        objects: dict[str, list[Any]] = {}
        try:
            args = check_put_args(partition_id, sample_ids, fields, tags)
            for name in args.names:
                leaf = fields.get(name)
                if wire_leaf_kind(name, leaf, len(args.ids)) == TENSOR_LEAF:
                    tensors[name] = leaf
                else:
                    objects[name] = leaf.tolist()
        except (TypeError, ValueError):
            self._require_known(partition_id)  # unknown partition outranks
            raise
        ids = args.ids
        encoded = {name: encode_column(name, t) for name, t in tensors.items()}
        inline = sum(e.nbytes for e in encoded.values()) <= INLINE_MAX_BYTES
        ref = None  # one object per put: one object-store write whatever the width
        if encoded and ids and not inline:
            ref = ray.put({k: e.payload for k, e in encoded.items()})
        columns: dict[str, Any] = {}
        for name in args.names:
            if name in objects:
                columns[name] = objects[name]
            else:
                enc = encoded[name]
                carrier = InlinePayload({name: enc.payload}) if inline and ids else ref
                columns[name] = TensorColumnSpec(enc.dtype, enc.layout, carrier, name)
        self._call("put", partition_id, partition_id, ids, columns, args.tags)
        return put_receipt(partition_id, ids, list(args.names) or None, tensors.get(INPUT_LENGTHS), args.tags)

    def _get(self, sample_ids: Any, partition_id: Any, select_fields: Any) -> TensorDict:
        self._begin()
        ids, names = self._read_args(sample_ids, select_fields, lambda: self._require_known(partition_id))
        if not ids:
            return TensorDict({}, batch_size=(0,))
        plan, chunks = self._call("locate", partition_id, partition_id, ids, names)
        payloads = self._chunk_payloads(chunks, partition_id, "get_samples")
        out: dict[str, Any] = {}
        for name in names:
            entry = plan[name]
            if entry[0] == OBJECT:
                out[name] = NonTensorStack.from_list(list(entry[1]))
                continue
            _, dtype, segments = entry
            out[name] = gather_field(
                name,
                dtype_from_name(dtype),
                [Segment(chunks[cid][2], payloads[cid], positions) for cid, positions in segments],
            )
        return TensorDict(out, batch_size=(len(ids),))

    def _list_ids(self, partition_id: Any) -> list[str]:
        self._begin()
        return list(self._call("list_ids", partition_id, partition_id))

    def _clear(self, sample_ids: Any, partition_id: Any) -> None:
        """Clear with the metadata actor; a partition emptied by explicit ids stays registered."""
        self._begin()
        ids = None if sample_ids is None else _listed(sample_ids)
        self._call("clear", partition_id, partition_id, ids)

    def close(self) -> None:
        """Close this client (idempotent); the bootstrapping client also kills the actor, freeing every column."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            actor, self._actor = self._actor, None
            if self._bootstrap and actor is not None:
                kill_actor(actor, self._actor_s)


def build_ray_store_client(cfg: Any, *, bootstrap: bool = True, checkpointing: bool = False) -> RayStoreClient:
    """The backend registry's constructor for the ray_store backend (checkpointing always supported)."""
    return RayStoreClient(cfg, bootstrap=bootstrap, checkpointing=checkpointing)
