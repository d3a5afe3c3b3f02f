"""``Checkpointer`` (periodic atomic checkpoints of one phase) and ``load_start_state``."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nemo_dp.training.checkpoint_discovery import latest_checkpoint, list_step_dirs, temp_step_dirs
from nemo_dp.utils.checkpoint import checkpoint_dir_for_step, load_training_checkpoint, save_training_checkpoint

__all__ = ["Checkpointer", "load_start_state", "checkpoint_finalizer", "remove_stale_temp_dirs"]


class Checkpointer:
    """Atomic ``step_<N>`` checkpoints of one phase under ``root``, every ``save_period`` steps (0: at the
    end only), keeping ``keep_last``; ``finalize(tmp_dir, step)`` runs in every write before the commit
    rename (trainers writing their own checkpoint directory call it too)."""

    def __init__(
        self,
        root: str | Path,
        *,
        enabled: bool,
        save_period: int,
        keep_last: int,
        finalize: Callable[[Path, int], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.finalize = finalize
        self.enabled = enabled
        self.save_period = save_period
        self.keep_last = keep_last

    def should_save(self, step: int, *, final: bool) -> bool:
        return self.enabled and (final or (self.save_period > 0 and step % self.save_period == 0))

    def save(self, step: int, state_fn: Callable[[], dict[str, Any]]) -> Path:
        """Write the checkpoint for ``step`` (``state_fn`` builds the state), prune old ones; return its path."""
        finalize = self.finalize
        fin = None if finalize is None else (lambda tmp: finalize(tmp, step))
        path = save_training_checkpoint(checkpoint_dir_for_step(self.root, step), state_fn(), finalize=fin)
        self.prune()
        return path

    def prune(self) -> None:
        """Delete all but the ``keep_last`` newest committed checkpoints under ``root``."""
        committed = [p for _, p in list_step_dirs(self.root, committed=True)]
        for old in committed[: max(0, len(committed) - self.keep_last)]:
            shutil.rmtree(old, ignore_errors=True)


def checkpoint_finalizer(
    *,
    algorithm: str,
    phase: str,
    model_shape: Mapping[str, int],
    data_plane: str,
    run_id: str,
    settings: Mapping[str, Any] | None = None,
) -> Callable[[Path, int], None]:
    """The ``finalize`` of a run's checkpointer: ``checkpoint_meta.json`` (these :class:`CheckpointMeta`
    fields), then the file manifest, last so that it covers every file."""
    from nemo_dp.training.resume import CheckpointMeta, write_checkpoint_meta
    from nemo_dp.utils.manifest import write_manifest

    owner = {"algorithm": algorithm, "phase": phase, "model_shape": dict(model_shape), "data_plane": data_plane}
    kept = dict(settings or {})

    def finalize(tmp: Path, step: int) -> None:
        write_checkpoint_meta(tmp, CheckpointMeta(**owner, run_id=run_id, step=step, settings=kept))
        write_manifest(tmp)

    return finalize


def load_start_state(root: str | Path | None) -> dict[str, Any] | None:
    """The latest checkpoint's state (plus ``checkpoint_path``) under ``root`` (may be absent), or ``None``."""
    latest = None if root is None else latest_checkpoint(root)
    return None if latest is None else load_checkpoint_state(latest)


def load_checkpoint_state(path: str | Path) -> dict[str, Any]:
    """The training state of one step directory, plus ``checkpoint_path``."""
    state = load_training_checkpoint(path)
    state["checkpoint_path"] = str(path)
    return state


def remove_stale_temp_dirs(ckpt_root: str | Path) -> list[Path]:
    """Remove the ``step_<N>.tmp-<hex>`` directories killed checkpoint writes left in the phase roots of
    ``ckpt_root`` (may not exist): never checkpoints, but debris of an earlier process; return them."""
    removed: list[Path] = []
    for child in temp_step_dirs(ckpt_root):
        shutil.rmtree(child, ignore_errors=True)
        if not child.exists():
            removed.append(child)
    return removed
