"""Driver side of the colocated SFT loader (workers: ``nemo_dp.models.policy.sft_loader_worker``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nemo_dp.data_plane import registry
from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError, KVBatchMeta
from nemo_dp.models.policy.sft_loader_worker import SFTBatchEnvelope

__all__ = ["ColocatedLoaderGroup"]


class ColocatedLoaderGroup:
    """Runs the loader calls on every DP rank and checks the envelopes.

    The backend's ``checkpoint_scope`` places the data plane's checkpoint: ``"process"``, each
    worker's store under ``<dir>/dp{r}``; ``"cluster"``, the shared store under ``<dir>/<checkpoint_subdir>``.

    Raises:
        ValueError: The data plane is disabled or invalid (lists the legal options).
    """

    def __init__(self, policy: Any, data_plane_cfg: Any) -> None:
        from nemo_dp.data_plane.factory import data_plane_kind

        # Classified, not fully validated: the policy that built the clients validated it.
        backend = registry.backend(data_plane_kind(data_plane_cfg))
        if not backend.enabled:
            legal = [registry.backend(k).option for k in registry.enabled_kinds()]
            raise ValueError(
                "data_plane: the colocated SFT loader needs an enabled data plane "
                f"({' or '.join(f'data_plane={o}' for o in legal)}), got "
                f"data_plane={backend.option}"
            )
        self.backend = backend
        self.policy = policy
        self.data_plane_cfg = data_plane_cfg
        self.worker_group = policy.worker_group
        self.dp_size = int(self.worker_group.world_size)
        # (k, envelopes of batch k in rank order) handed out by the last fused step, if every
        # rank readied batch k; dropped by every call that drops or repositions batches.
        self._ready: tuple[int, list[SFTBatchEnvelope]] | None = None
        # (k, what a rank said) when the last fused step could not ready batch k because the
        # store stopped answering: loading k would only wait out the same bound again.
        self._unavailable: tuple[int, str] | None = None

    def max_live_batches(self) -> int:
        """Batches one loader may hold in the store (active + prefetched)."""
        bound = self.backend.max_live_batches(self.data_plane_cfg)
        if bound is None:
            raise ValueError(
                f"data_plane={self.backend.option}: the backend registers no live-batch bound for the colocated loader"
            )
        return int(bound)

    def save_data_plane(self, directory: str | os.PathLike[str], metadata: Mapping[str, Any]) -> None:
        """Write the data plane's checkpoint, with JSON ``metadata``, under ``directory``."""
        if self.backend.checkpoint_scope == "process":
            self.save_worker_stores(directory, metadata)
        else:
            self.policy.dp_client.save_checkpoint(self._shared_dir(directory), metadata=dict(metadata))

    def load_data_plane(self, directory: str | os.PathLike[str]) -> None:
        """Restore :meth:`save_data_plane`'s checkpoint from ``directory`` into the (clean) clients."""
        if self.backend.checkpoint_scope == "process":
            self.load_worker_stores(directory)
        else:
            self.policy.dp_client.load_checkpoint(self._shared_dir(directory))

    def _shared_dir(self, directory: str | os.PathLike[str]) -> Path:
        subdir = self.backend.checkpoint_subdir
        if self.backend.checkpoint_scope != "cluster" or subdir is None:
            raise ValueError(
                f"data_plane={self.backend.option}: checkpoint scope "
                f"{self.backend.checkpoint_scope!r} has no data-plane checkpoint"
            )
        return Path(directory) / subdir

    def _forget_readied(self) -> None:
        self._ready = None
        self._unavailable = None

    def setup(self, loader: Any, **kwargs: Any) -> None:
        """``setup_colocated_loader(loader, **kwargs)`` on every rank."""
        self._forget_readied()
        self.worker_group.run_all("setup_colocated_loader", loader, **kwargs)

    def set_position(self, next_batch_index: int) -> None:
        """``set_colocated_position`` on every rank."""
        self._forget_readied()
        self.worker_group.run_all("set_colocated_position", int(next_batch_index))

    def load(self, batch_index: int, prefetch: bool = True) -> list[SFTBatchEnvelope]:
        """Load batch ``batch_index`` on every rank; return the checked envelopes in rank order.

        Raises:
            ValueError: As :meth:`_checked`.
            DataPlaneUnavailableError: The last fused step could not ready this batch because the store
                did not answer; raised at once instead of waiting out the bound again.
        """
        unavailable = self._unavailable
        self._forget_readied()
        if unavailable is not None and unavailable[0] == int(batch_index):
            raise DataPlaneUnavailableError(
                f"SFT batch {batch_index}: readying it after the previous step failed because the "
                f"store did not answer ({unavailable[1]}); not loading it again"
            )
        envelopes = list(self.worker_group.run_all("load_sft_batch", int(batch_index), prefetch))
        return self._checked(batch_index, envelopes)

    def take_ready(self, batch_index: int) -> list[SFTBatchEnvelope] | None:
        """The checked envelopes of batch ``batch_index`` the last :meth:`run_step` readied (then forgotten), or None.

        Raises:
            ValueError: As :meth:`_checked`.
        """
        ready, self._ready = self._ready, None
        if ready is None or ready[0] != int(batch_index):
            return None
        return self._checked(batch_index, ready[1])

    def run_step(
        self, batch_index: int, placed_metas: Sequence[KVBatchMeta], loss_fn: Any, mbs: int | None = None
    ) -> list[dict[str, Any]]:
        """The fused SFT step (train, commit, ready ``k + 1``) on every rank; returns the ranks' results.

        ``placed_metas``: one per DP rank, in rank order; ``mbs``: rows per micro-batch (``None``: the config's).
        """
        self._forget_readied()
        k = int(batch_index)
        outs = list(self.worker_group.run_sharded("run_sft_step", list(placed_metas), k, loss_fn, mbs=mbs))
        nxt = [o["next"] for o in outs]
        if all(e is not None for e in nxt):
            self._ready = (k + 1, nxt)
        dead = [(r, o["next_error"]) for r, o in enumerate(outs) if o.get("next_store_unavailable")]
        if dead:
            self._unavailable = (k + 1, f"DP rank {dead[0][0]}: {dead[0][1]}")
        return outs

    def _checked(self, batch_index: int, envelopes: list[SFTBatchEnvelope]) -> list[SFTBatchEnvelope]:
        """``envelopes`` in rank order after checking one per DP rank and equal micro-batch counts."""
        envelopes = list(envelopes)
        ranks = [e.dp_rank for e in envelopes]
        if sorted(ranks) != list(range(self.dp_size)):
            raise ValueError(
                f"SFT batch {batch_index}: envelopes came from DP ranks {ranks}, expected exactly "
                f"{list(range(self.dp_size))}"
            )
        envelopes.sort(key=lambda e: e.dp_rank)
        counts = [e.num_microbatches for e in envelopes]
        if len(set(counts)) != 1:
            raise ValueError(
                f"SFT batch {batch_index}: DP ranks would run different numbers of micro-batches "
                f"{counts}; every rank must run the same count"
            )
        return envelopes

    def abort(self, batch_index: int | None = None) -> None:
        """Abort on every rank; with ``batch_index`` also roll back a rank's commit of it."""
        self._forget_readied()
        if batch_index is None:
            self.worker_group.run_all("abort_sft_batch")
        else:
            self.worker_group.run_all("abort_sft_batch", int(batch_index))

    def quiesce(self) -> dict[str, Any]:
        """Quiesce every rank; return the committed position.

        Raises:
            RuntimeError: The ranks disagree on the position.
        """
        self._forget_readied()
        states = list(self.worker_group.run_all("quiesce_colocated_loader"))
        first = {k: v for k, v in states[0].items() if k != "dp_rank"}
        for s in states[1:]:
            if {k: v for k, v in s.items() if k != "dp_rank"} != first:
                raise RuntimeError(f"colocated loaders disagree on their position: {states}")
        return first

    def save_worker_stores(self, root: str | os.PathLike[str], metadata: Mapping[str, Any]) -> list[str]:
        """Each rank saves its own store under ``root/dp{r}`` (single-node shared filesystem)."""
        dirs = [str(Path(root) / f"dp{r}") for r in range(self.dp_size)]
        return list(self.worker_group.run_sharded("save_colocated_data_plane", dirs, metadata=dict(metadata)))

    def load_worker_stores(self, root: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """Each rank restores its store from ``root/dp{r}``."""
        dirs = [str(Path(root) / f"dp{r}") for r in range(self.dp_size)]
        return list(self.worker_group.run_sharded("load_colocated_data_plane", dirs))