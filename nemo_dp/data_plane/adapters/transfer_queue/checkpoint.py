"""Checkpoints of the TransferQueue data plane: the driver reads every partition through its own calls;
a load re-creates the partitions, re-puts the rows and re-claims what was claimed."""

from __future__ import annotations

from collections.abc import Mapping
from os import PathLike
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict

from nemo_dp.data_plane.adapters.transfer_queue.checkpoint_format import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_FORMAT_VERSION,
    KIND_OBJECT,
    OLD_FILES,
    PartitionState,
    decode_partition,
    encode_partition,
)
from nemo_dp.data_plane.adapters.transfer_queue.registry import parse_registry, type_entries, write_registry
from nemo_dp.data_plane.schema import RESERVED_PREFIX
from nemo_dp.data_plane.typed_checkpoint import PartitionHeader, new_manifest, read_checkpoint, write_checkpoint
from nemo_dp.utils.checkpoint_io import validate_json_metadata

#: Field names (outside every user's namespace) that re-claim rows on load, one per task.
_CLAIM_FIELD = f"{RESERVED_PREFIX}_claim_"


def _positions(indexes: Any) -> dict[int, int]:
    return {} if indexes is None else {int(g): i for i, g in enumerate(indexes.tolist())}


class TQCheckpointMixin:
    """``save_checkpoint`` / ``load_checkpoint`` of ``TQDataPlaneClient``."""

    _used: bool
    _cfg: Any
    _client: Any
    _lock: Any

    def _read_partition(self, rec: Any) -> PartitionState:
        """One partition as the adapter sees it (ids in the controller's order)."""
        pid = rec.partition_id
        client = self._client

        async def _state() -> tuple[dict[str, Any], list[int], dict[str, Any], dict[str, Any]]:
            info = await client.async_kv_list(pid)
            tags = dict(info.get(pid, {}))
            if not tags:
                return tags, [], {}, {}
            meta = await client.async_kv_retrieve_meta(keys=list(tags), partition_id=pid, create=False)
            produced = {f: await client.async_get_production_status([f], pid) for f in rec.field_types}
            consumed = {t: await client.async_get_consumption_status(t, pid) for t in rec.tasks}
            return tags, list(meta.global_indexes), produced, consumed

        tags, gindex, produced, consumed = self._ctl(_state, "save_checkpoint", pid)  # type: ignore[attr-defined]
        keys = list(tags)
        if len(gindex) != len(keys):
            raise RuntimeError(f"save_checkpoint: TransferQueue resolved {len(gindex)} of {len(keys)} ids of {pid!r}")
        order = sorted(range(len(keys)), key=lambda i: gindex[i])
        ids = [keys[i] for i in order]
        index_of = {keys[i]: gindex[i] for i in order}
        holds: dict[str, list[str]] = {sid: [] for sid in ids}
        for name, (indexes, status) in produced.items():
            pos = _positions(indexes)
            for sid in ids:
                if (row := pos.get(index_of[sid])) is not None and bool(status[row].all()):
                    holds[sid].append(name)
        claimed: dict[str, list[str]] = {}
        for task, (indexes, status) in consumed.items():
            pos = _positions(indexes)
            got = [sid for sid in ids if (row := pos.get(index_of[sid])) is not None and int(status[row]) == 1]
            if got:
                claimed[task] = got
        by_fields: dict[tuple[str, ...], list[str]] = {}
        for sid in ids:
            if holds[sid]:
                by_fields.setdefault(tuple(holds[sid]), []).append(sid)
        groups: list[tuple[list[str], dict[str, Any]]] = []
        for names, gids in by_fields.items():
            data = self.get_samples(gids, pid, list(names))  # type: ignore[attr-defined]
            objects = {name for name in names if rec.field_types[name][0] == KIND_OBJECT}
            groups.append((gids, {n: data.get(n).tolist() if n in objects else data.get(n) for n in names}))
        enums = {k: list(v) for k, v in rec.enums.items()}
        tagged = {sid: tags[sid] for sid in ids if tags[sid]}
        header = PartitionHeader(
            pid, list(rec.fields), list(rec.tasks), rec.num_samples, rec.group_size, enums, ids, tagged, claimed
        )
        return PartitionState(header, {k: tuple(v) for k, v in rec.field_types.items()}, groups)

    def save_checkpoint(self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None) -> None:
        """Atomically save every partition plus user ``metadata``.

        Raises:
            RuntimeError: Closed, or not the bootstrapping client.
            TypeError | ValueError: Non-JSON ``metadata``, or a stored value that cannot be encoded (nothing written).
        """
        self._check_open()  # type: ignore[attr-defined]
        self._require_owner("save_checkpoint")
        user_meta = validate_json_metadata(metadata)
        with self._lock:
            used = self._used  # reading the store does not make this client unclean
            try:
                records = parse_registry(self._registry_entries("save_checkpoint", ""))  # type: ignore[attr-defined]
                states = [self._read_partition(records[pid]) for pid in sorted(records)]
            finally:
                self._used = used
            tensors: dict[str, torch.Tensor] = {}
            records = [encode_partition(s, i, tensors) for i, s in enumerate(states)]
            manifest = new_manifest(
                CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, user_meta, records, backend=self._cfg.backend
            )
            write_checkpoint(checkpoint_dir, manifest, tensors)

    def _read_checkpoint(self, checkpoint_dir: str | PathLike) -> tuple[list[PartitionState], dict]:
        """Read and validate a checkpoint completely, touching no store."""
        ck = read_checkpoint(checkpoint_dir, CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_VERSION, OLD_FILES)
        backend = ck.manifest.get("backend")
        if backend != self._cfg.backend:
            raise ValueError(f"{ck.where} is for backend {backend!r}, this client runs {self._cfg.backend!r}")
        states = [decode_partition(rec, ck.tensors, f"{ck.where} partitions[{i}]") for i, rec in enumerate(ck.partitions)]
        return states, ck.metadata

    def _restore_partition(self, state: PartitionState) -> None:
        h = state.header
        pid = h.partition_id
        register = self.register_partition  # type: ignore[attr-defined]
        register(pid, h.fields, h.num_samples, h.consumer_tasks, h.grpo_group_size, h.enums)
        incarnation = parse_registry(self._registry_entries("load_checkpoint", pid))[pid].incarnation  # type: ignore[attr-defined]
        client = self._client
        types = type_entries(pid, incarnation, state.field_types)
        ids = h.sample_ids

        async def _reserve() -> None:
            if types:
                await write_registry(client, types)
            if ids:  # allocates the ids in their saved order, which claims follow
                await client.async_kv_retrieve_meta(keys=list(ids), partition_id=pid, create=True)

        self._ctl(_reserve, "load_checkpoint", pid)  # type: ignore[attr-defined]
        in_group = set()
        for gids, columns in state.groups:
            in_group |= set(gids)
            whole = {n: c for n, c in columns.items() if not isinstance(c, list) or state.field_types[n][0] == KIND_OBJECT}
            td = TensorDict(
                {n: NonTensorStack(*c) if isinstance(c, list) else c for n, c in whole.items()}, batch_size=[len(gids)]
            )
            tags = [h.tags.get(sid) or {} for sid in gids]
            self.put_samples(gids, pid, td if whole else None, tags=tags)  # type: ignore[attr-defined]
            for name, rows in columns.items():
                if name in whole:
                    continue
                for sid, row in zip(gids, rows, strict=True):
                    self.put_samples([sid], pid, TensorDict({name: row.unsqueeze(0)}, batch_size=[1]))  # type: ignore[attr-defined]
        tagged = [sid for sid in ids if sid not in in_group and h.tags.get(sid)]
        if tagged:
            self.put_samples(tagged, pid, None, tags=[h.tags[sid] for sid in tagged])  # type: ignore[attr-defined]
        for t_index, (task, claimed) in enumerate(h.claimed.items()):
            self._reclaim(pid, task, claimed, f"{_CLAIM_FIELD}{t_index}")

    def _reclaim(self, pid: str, task: str, claimed: list[str], marker: str) -> None:
        """Mark exactly ``claimed`` consumed for ``task``: write a ``marker`` field (never declared, read or saved)
        only these rows hold and claim the rows holding it, as the library marks rows consumed only by a claim.
        """
        client = self._client

        async def _claim() -> tuple[list[int], list[int]]:
            meta = await client.async_kv_retrieve_meta(keys=list(claimed), partition_id=pid, create=False)
            meta.custom_meta = []  # no tag RPC: the rows keep their tags
            marks = TensorDict({marker: torch.zeros(len(claimed), dtype=torch.uint8)}, batch_size=[len(claimed)])
            await client.async_put(marks, meta)
            got = await client.async_get_meta(
                data_fields=[marker], batch_size=len(claimed), partition_id=pid, mode="fetch", task_name=task
            )
            return sorted(int(g) for g in meta.global_indexes), sorted(int(g) for g in got.global_indexes)

        want, got = self._data(_claim, "load_checkpoint", pid)  # type: ignore[attr-defined]
        if want != got:
            raise RuntimeError(
                f"load_checkpoint: re-claiming {len(want)} rows of {pid!r} for task {task!r} claimed "
                f"{len(got)} other rows"
            )

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        """Restore a checkpoint into this clean bootstrapping client; return the user metadata.

        Raises:
            RuntimeError: Closed, not the bootstrapping client, or not clean (also: the registry is not empty).
            FileNotFoundError | ValueError: As ``typed_checkpoint.read_checkpoint``, or another backend's.
        """
        self._check_open()  # type: ignore[attr-defined]
        self._require_owner("load_checkpoint")
        with self._lock:
            self._begin_load()  # type: ignore[attr-defined]
            entries = self._registry_entries("load_checkpoint", "")  # type: ignore[attr-defined]
            if parse_registry(entries):
                raise RuntimeError(
                    "load_checkpoint needs a clean data-plane client: the cluster-wide registry "
                    f"already holds partitions {sorted(parse_registry(entries))}"
                )
            states, user_meta = self._read_checkpoint(checkpoint_dir)
            for state in states:
                self._restore_partition(state)
            return user_meta
