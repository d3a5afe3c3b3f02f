"""Checkpoints of the TransferQueue data plane: one atomic directory, written by the driver.

Why this module exists: the library can save its controller and storage state, but not
atomically, without a format marker, and from any process.  :class:`TQCheckpointMixin` gives the
client an atomic save (temp directory + rename, a JSON manifest with format, version, backend
and user metadata) and a load that refuses a client that is not clean.  The library's own files
are pickles: load checkpoints only from trusted paths.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from nemo_dp.data_plane.adapters.transfer_queue.registry import parse_registry
from nemo_dp.data_plane.interfaces import DataPlaneUnavailableError
from nemo_dp.utils.checkpoint_io import (
    read_manifest,
    validate_json_metadata,
    write_checkpoint_atomically,
    write_manifest,
)

CHECKPOINT_FORMAT = "nemo_dp.tq_data_plane"
CHECKPOINT_FORMAT_VERSION = 1
_CHECKPOINT_SUBDIR = "tq"
# File names the library's own save_checkpoint/load_checkpoint use inside its directory.
_TQ_CONTROLLER_FILE = "controller_state.pkl"
_TQ_METADATA_FILE = "metadata.json"


class TQCheckpointMixin:
    """``save_checkpoint`` / ``load_checkpoint`` of ``TQDataPlaneClient``.

    Host contract (the client): ``_check_open()``, ``_data(make, op, partition_id)``,
    ``_registry_entries(op, partition_id)``, ``_lock``, ``_used``, ``_bootstrap``, ``_cfg`` and
    ``_client`` (the library client).
    """

    _bootstrap: bool
    _used: bool
    _cfg: Any
    _client: Any
    _lock: Any

    def _require_checkpoint_owner(self, op: str) -> None:
        if not self._bootstrap:
            raise RuntimeError(
                f"{op} is only available on the bootstrapping TransferQueue client (the driver); "
                "this client attached with bootstrap=False"
            )

    def save_checkpoint(
        self, checkpoint_dir: str | PathLike, *, metadata: Mapping | None = None
    ) -> None:
        """Atomically save the whole TransferQueue state plus user ``metadata``.

        Raises:
            RuntimeError: Closed, or not the bootstrapping client.
            TypeError | ValueError: ``metadata`` is not JSON-serialisable (nothing written).
        """
        self._check_open()
        self._require_checkpoint_owner("save_checkpoint")
        user_meta = validate_json_metadata(metadata)
        client = self._client

        def _write(tmp_dir: Path) -> None:
            tq_dir = tmp_dir / _CHECKPOINT_SUBDIR
            tq_dir.mkdir()

            async def _save() -> None:
                await client.async_save_controller_checkpoint(str(tq_dir / _TQ_CONTROLLER_FILE))
                await client.async_save_storage_checkpoint(str(tq_dir))

            self._data(_save, "save_checkpoint", "")
            # Same layout as the library's own save_checkpoint, so either loader reads it.
            with open(tq_dir / _TQ_METADATA_FILE, "w", encoding="utf-8") as fh:
                json.dump({"storage_saved": True, "user_metadata": {}}, fh)
            write_manifest(
                tmp_dir,
                {
                    "format": CHECKPOINT_FORMAT,
                    "format_version": CHECKPOINT_FORMAT_VERSION,
                    "backend": self._cfg.backend,
                    "metadata": user_meta,
                },
            )

        with self._lock:
            write_checkpoint_atomically(checkpoint_dir, _write)

    def load_checkpoint(self, checkpoint_dir: str | PathLike) -> dict:
        """Restore a checkpoint into this clean bootstrapping client; return the user metadata.

        Raises:
            RuntimeError: Closed, not the bootstrapping client, or not a clean data-plane client
                (a data operation or a load already ran, or the cluster registry is not empty).
            FileNotFoundError: Missing directory, manifest or library files.
            ValueError: Unknown format/version or corrupt content (naming the file).
        """
        self._check_open()
        self._require_checkpoint_owner("load_checkpoint")
        with self._lock:
            if self._used:
                raise RuntimeError(
                    "load_checkpoint needs a clean data-plane client: a data operation or a load "
                    "already ran on this client"
                )
            self._used = True
            entries = self._registry_entries("load_checkpoint", "")
            if parse_registry(entries):
                raise RuntimeError(
                    "load_checkpoint needs a clean data-plane client: the cluster-wide registry "
                    f"already holds partitions {sorted(parse_registry(entries))}"
                )
            manifest = read_manifest(
                checkpoint_dir,
                expected_format=CHECKPOINT_FORMAT,
                supported_versions=(CHECKPOINT_FORMAT_VERSION,),
            )
            root = Path(checkpoint_dir).resolve()
            manifest_path = root / "manifest.json"
            if manifest.get("backend") != self._cfg.backend:
                raise ValueError(
                    f"checkpoint manifest {str(manifest_path)!r} is for backend "
                    f"{manifest.get('backend')!r}, this client runs {self._cfg.backend!r}"
                )
            user_meta = manifest.get("metadata")
            if not isinstance(user_meta, dict):
                raise ValueError(
                    f"checkpoint manifest {str(manifest_path)!r} is corrupt: 'metadata' must be "
                    f"a JSON object, got {type(user_meta).__name__}"
                )
            tq_dir = root / _CHECKPOINT_SUBDIR
            controller_file = tq_dir / _TQ_CONTROLLER_FILE
            for required in (tq_dir, controller_file):
                if not required.exists():
                    raise FileNotFoundError(f"TransferQueue checkpoint file {str(required)!r} is missing")
            client = self._client

            async def _load() -> None:
                await client.async_load_storage_checkpoint(str(tq_dir))
                await client.async_load_controller_checkpoint(str(controller_file))

            try:
                self._data(_load, "load_checkpoint", "")
            except (FileNotFoundError, DataPlaneUnavailableError):
                raise
            except (RuntimeError, ValueError) as exc:
                raise ValueError(
                    f"TransferQueue checkpoint under {str(tq_dir)!r} could not be restored: {exc}"
                ) from exc
            return copy.deepcopy(user_meta)
