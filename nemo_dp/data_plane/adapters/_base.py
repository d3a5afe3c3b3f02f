"""The open/closed/bootstrap plumbing every data-plane client shares, and config coercion.

:class:`BaseDataPlaneClient` keeps a client's lifetime flags (closed, used, bootstrapping) and
the errors that go with them, the polling loop of a claim against shared metadata and the
``get_data`` that resolves fields and reads by key, so that each adapter's client only moves its
bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from tensordict import TensorDict

from nemo_dp.data_plane.adapters._validation import (
    check_meta,
    claim_timeout,
    closed_error,
    get_data_fields,
    lengths_from_tags,
)
from nemo_dp.data_plane.interfaces import DataPlaneClient, KVBatchMeta

__all__ = ["BaseDataPlaneClient", "coerce_dataclass_config"]

C = TypeVar("C")


class BaseDataPlaneClient(DataPlaneClient):
    """A data-plane client's lifetime flags.

    Subclasses set :attr:`BACKEND` and call :meth:`_init_lifetime` first in ``__init__``;
    ``close`` sets ``_closed``.
    """

    #: The backend's name in messages.
    BACKEND: ClassVar[str] = "data-plane"

    _bootstrap: bool
    _closed: bool
    _used: bool

    def _init_lifetime(self, bootstrap: bool, *, closed: bool) -> None:
        """Set the flags: ``closed`` until construction succeeds where it can fail."""
        self._bootstrap = bool(bootstrap)
        self._closed = closed
        self._used = False

    @property
    def is_bootstrap(self) -> bool:
        """Whether this client created (and on close tears down) the backend's shared state."""
        return self._bootstrap

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run."""
        return self._closed

    def _check_open(self) -> None:
        """Raise the closed error once ``close()`` has run."""
        if self._closed:
            raise closed_error(self.BACKEND)

    def _begin(self) -> None:
        """Start a data operation: the client must be open, and is no longer clean."""
        self._check_open()
        self._used = True

    def _require_owner(self, op: str) -> None:
        """Refuse ``op`` on a client that attached instead of bootstrapping.

        Raises:
            RuntimeError: ``bootstrap=False``.
        """
        if not self._bootstrap:
            raise RuntimeError(
                f"{op} is only available on the bootstrapping {self.BACKEND} client (the "
                "driver); this client attached with bootstrap=False"
            )

    def _require_known(self, partition_id: str) -> None:
        """Raise ``KeyError`` unless ``partition_id`` is registered (argument-error precedence)."""
        raise NotImplementedError

    def get_data(self, meta: KVBatchMeta, select_fields: Sequence[str] | None = None) -> TensorDict:
        """Fetch ``meta``'s rows (fields from ``select_fields``, else ``meta.fields``).

        Raises:
            RuntimeError: Closed.
            TypeError: ``meta`` is not a ``KVBatchMeta``.
            KeyError: Unknown partition; otherwise as ``get_samples``.
            ValueError: No field can be resolved (``select_fields``/``fields``).
        """
        self._begin()
        check_meta(meta)
        try:
            fields = get_data_fields(meta, select_fields)
        except ValueError:
            self._require_known(meta.partition_id)
            raise
        return self.get_samples(meta.sample_ids, meta.partition_id, fields)

    @staticmethod
    def _poll_claim(
        attempt: Callable[[], tuple[list[str], list[dict[str, Any]] | None]],
        partition_id: str,
        task_name: str,
        fields: Any,
        batch_size: int,
        blocking: bool,
        timeout_s: Any,
        poll_s: float,
    ) -> KVBatchMeta:
        """Run a claim ``attempt`` until it claims rows, polling every ``poll_s`` seconds.

        Args:
            attempt: One claim against the shared metadata (validating the arguments): the
                claimed ids (empty when fewer than ``batch_size`` are ready) and their tags.
            partition_id: The partition.
            task_name: The consumer task.
            fields: The required fields.
            batch_size: Rows to claim.
            blocking: Wait (``True``) or return an empty claim at once.
            timeout_s: How long a blocking claim may wait.
            poll_s: Seconds between attempts.

        Raises:
            TimeoutError: ``blocking`` and fewer than ``batch_size`` rows ready in time.
        """
        wait_s = float(timeout_s) if isinstance(timeout_s, (int, float)) else 0.0
        deadline = time.monotonic() + wait_s
        while True:
            ids, tags = attempt()
            if ids:
                return KVBatchMeta(
                    partition_id,
                    task_name,
                    ids,
                    fields=list(fields),
                    sequence_lengths=lengths_from_tags(tags),
                    tags=tags,
                )
            if not blocking:
                return KVBatchMeta(partition_id, task_name, [], fields=list(fields))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise claim_timeout(partition_id, task_name, batch_size, timeout_s)
            time.sleep(min(poll_s, remaining))

    def _begin_load(self) -> None:
        """Start a ``load_checkpoint``: only a clean client (no data operation, no load) may.

        Raises:
            RuntimeError: A data operation or a load already ran on this client.
        """
        if self._used:
            raise RuntimeError(
                "load_checkpoint needs a clean data-plane client: a data operation or a load "
                "already ran on this client; build a new client to load into"
            )
        self._used = True


def coerce_dataclass_config(cfg: Any, cls: type[C], client: str) -> C:
    """``cfg`` as a validated ``cls`` instance (a dataclass config).

    Args:
        cfg: A ``cls`` instance, or a mapping / ``DictConfig`` of its keys.
        cls: The config dataclass.
        client: The client's name, for the message.

    Raises:
        TypeError: ``cfg`` is neither a ``cls`` nor a mapping.
        ValueError: A key is unknown or out of range (names it).
    """
    if isinstance(cfg, cls):
        return cfg
    if isinstance(cfg, Mapping):
        from omegaconf import DictConfig, OmegaConf

        container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
        out = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), container))
        assert isinstance(out, cls)
        return out
    raise TypeError(f"{client} needs a {cls.__name__} (or a mapping of it), got {type(cfg).__name__}")
