"""Data-plane SFT trainer: colocated loaders put batches into the store, the driver moves metas.

A failed step aborts every rank so a retry sees the same rows (except on ``DataPlaneUnavailableError``);
losses equal ``sft_train``'s bit for bit.  Checkpoints drop readied batches first.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_dp.algorithms.context import PhaseCheckpointer, TrainContext, TrainHooks
from nemo_dp.algorithms.sft_loader import ColocatedLoaderGroup
from nemo_dp.algorithms.sft_step import run_sft
from nemo_dp.algorithms.trainer_common import DriverPathHooks, trainer_state
from nemo_dp.config.schema import train_micro_batch_rows
from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError
from nemo_dp.utils.checkpoint_io import write_checkpoint_atomically, write_manifest
from nemo_dp.models.policy.sft_loader_worker import SFTBatchEnvelope
from nemo_dp.utils.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_FORMAT_VERSION,
    checkpoint_dir_for_step,
    encode_state,
    write_training_state,
)

__all__ = ["sft_train_sync", "ColocatedSFTPath", "sft_sync_step", "SFTStepResult", "DATA_PLANE_CKPT_DIR"]

#: Sub-directory of a training checkpoint holding the data plane's own checkpoint.
DATA_PLANE_CKPT_DIR = "data_plane"


@dataclass(slots=True)
class SFTStepResult:
    """What one committed step produced.

    Attributes:
        metrics: The ranks' metrics aggregated exactly as ``TQPolicy.finish_train_step`` does.
        driver_held_bytes: Pickled size of everything the driver held for the step's data.
        load_wait_s: Seconds waiting for the loaders (explicit load plus the slowest rank's readying).
        worker_calls: Driver -> worker round trips (1 in steady state, 2 when the batch was loaded first).
    """

    metrics: dict[str, Any]
    consumed: int
    envelopes: list[SFTBatchEnvelope]
    driver_held_bytes: int
    load_wait_s: float
    worker_calls: int


def sft_sync_step(policy: Any, loaders: ColocatedLoaderGroup, batch_index: int, loss_fn: Any) -> SFTStepResult:
    """One SFT step: (load) -> one fused train/commit/ready call per rank.

    Steady state is one round trip: step *k-1*'s fused call readied batch *k*; otherwise
    ``loaders.load`` runs first.  ``batch_index`` is the batch to train (= steps done).

    Raises:
        ValueError: Envelopes not one per DP rank / unequal micro-batch counts, or the placed-metadata checks.
        Exception: Anything the step raised, after aborting every rank's step and rewinding its loader
            to ``batch_index`` (so the same batch is loaded again).
        DataPlaneUnavailableError: The store stopped answering; raised at once, without the abort.
    """
    k = int(batch_index)
    dispatched = False
    calls = 1
    try:
        t0 = time.perf_counter()
        envelopes = loaders.take_ready(k)
        if envelopes is None:
            envelopes = loaders.load(k)
            calls = 2
        load_wait_s = time.perf_counter() - t0 if calls == 2 else 0.0
        held = len(pickle.dumps(envelopes))
        placed = policy.checked_placed_metas([e.meta for e in envelopes])
        dispatched = True
        outs = loaders.run_step(k, placed, loss_fn)
        metrics = policy._aggregate_train_results([{"per_step": [o["metrics"]]} for o in outs])
        consumed = int(sum(int(o["consumed"]) for o in outs))
        load_wait_s += max(float(o["load_s"]) for o in outs)
    except BaseException as exc:
        if isinstance(exc, DataPlaneUnavailableError):  # also a worker's, wrapped by Ray
            exc.add_note(
                f"(SFT batch {k} was not aborted: the data plane is unavailable, so this policy "
                "cannot train again; build a new one to continue)"
            )
            raise
        try:
            if dispatched:
                policy.abort_train_step()
        finally:
            try:
                loaders.abort(k)
            except Exception as abort_exc:  # keep the step's own error as the one raised
                exc.add_note(f"(aborting the SFT batch also failed: {abort_exc!r})")
        raise
    return SFTStepResult(metrics, consumed, envelopes, held, load_wait_s, calls)


def save_sft_checkpoint(
    checkpointer: PhaseCheckpointer,
    step: int,
    state: dict[str, Any],
    save_data_plane: Callable[[Path], None],
    *,
    hooks: TrainHooks | None = None,
) -> Path:
    """Write ``state`` and the data plane's checkpoint (``save_data_plane(dir)``) as one atomic ``step_<N>`` directory.

    The manifest is written after the state (``hooks.checkpoint_staged`` runs before it), then the
    checkpointer's ``finalize``; returns the committed directory.
    """

    encode_state(state)  # refuse a state that cannot be stored before touching the disk

    def write(tmp: Path) -> None:
        files = write_training_state(tmp, state)
        save_data_plane(tmp / DATA_PLANE_CKPT_DIR)
        if hooks is not None:
            hooks.checkpoint_staged(step, tmp)
        write_manifest(
            tmp,
            {
                "format": CHECKPOINT_FORMAT,
                "format_version": CHECKPOINT_FORMAT_VERSION,
                "keys": sorted(str(k) for k in state),
                "files": files,
                "data_plane_dir": DATA_PLANE_CKPT_DIR,
            },
        )
        finalize = getattr(checkpointer, "finalize", None)
        if finalize is not None:
            finalize(tmp, step)

    path = write_checkpoint_atomically(checkpoint_dir_for_step(checkpointer.root, step), write)
    checkpointer.prune()
    return path


class ColocatedSFTPath(DriverPathHooks):
    """SFT batches loaded by the workers' colocated loaders into the data plane (``ctx.policy`` a ``TQPolicy``)."""

    def __init__(self, ctx: TrainContext) -> None:
        self.policy = ctx.policy
        self.loaders = ColocatedLoaderGroup(ctx.policy, ctx.cfg.data_plane)

    def restore(self, state: dict[str, Any]) -> None:
        self.loaders.load_data_plane(Path(state["checkpoint_path"]) / DATA_PLANE_CKPT_DIR)

    def prepare(self, ctx: TrainContext, next_batch: int) -> None:
        pcfg = ctx.cfg.policy
        self.loaders.setup(
            ctx.train_loader,
            tokenizer=ctx.tokenizer,
            max_seq_len=int(pcfg.model.max_seq_len),
            micro_batch_size=train_micro_batch_rows(pcfg),
            max_live_batches=self.loaders.max_live_batches(),
        )
        self.loaders.set_position(next_batch)

    def train_step(self, batch_index: int, loss_fn: Any) -> tuple[dict[str, Any], int, dict[str, Any]]:
        result = sft_sync_step(self.policy, self.loaders, batch_index, loss_fn)
        extra = {
            "time/load_wait_s": result.load_wait_s,
            "time/load_s": max(e.load_time_s for e in result.envelopes),
            "data_plane/prefetched": float(all(e.prefetched for e in result.envelopes)),
            "driver/held_bytes": result.driver_held_bytes,
            "driver/worker_calls": result.worker_calls,
        }
        return result.metrics, result.consumed, extra

    def save_if_due(self, ctx: TrainContext, step: int, max_steps: int, counters: dict[str, Any]) -> None:
        if not ctx.checkpointer.should_save(step, final=step == max_steps):
            return
        position = self.loaders.quiesce()
        if position["next_batch"] != step:
            raise RuntimeError(f"colocated loaders are at batch {position['next_batch']} after step {step}")
        state = trainer_state("sft", counters, self.policy.state_dict(), position["loader"])
        meta = {"step": step, "algorithm": "sft"}
        save_sft_checkpoint(
            ctx.checkpointer, step, state, lambda d: self.loaders.save_data_plane(d, meta), hooks=ctx.hooks
        )

    def close(self) -> None:
        # Leave nothing behind in the store (prefetched batches) for a following phase (GRPO
        # after an SFT warm start reuses the same policy and, with TransferQueue, the same store).
        self.loaders.quiesce()


def sft_train_sync(ctx: TrainContext) -> dict[str, Any]:
    """Run SFT over the data plane (same context as ``sft_train``).

    ``ctx.policy`` is a ``TQPolicy`` with colocated-loader workers; ``ctx.train_loader`` is only the
    template shipped to the workers.

    Raises:
        ValueError: Sequence packing is enabled, or the data plane is not local/tq.
    """
    if bool(ctx.cfg.policy.sequence_packing.enabled):
        raise ValueError(
            "policy.sequence_packing.enabled=true is not supported by the data-plane SFT trainer "
            "(the colocated loader ships no producer micro-batch plan); legal: false"
        )
    return run_sft(ctx, ColocatedSFTPath(ctx))
