"""What every data-plane client shares: the public calls over backend hooks, lifetime flags, claim
polling, ``get_data`` and config coercion, so each adapter's client only moves bytes."""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, ClassVar, TypeVar

from tensordict import TensorDict

from nemo_dp.data_plane.adapters._validation import (
    check_meta,
    check_read_args,
    claim_timeout,
    closed_error,
    get_data_fields,
    lengths_from_tags,
)
from nemo_dp.data_plane.interfaces import DataPlaneClient, KVBatchMeta

C = TypeVar("C")


class BaseDataPlaneClient(DataPlaneClient):
    """The data-plane calls over a backend's hooks, and a client's lifetime flags.

    Subclasses set :attr:`BACKEND`, call :meth:`_init_lifetime` first in ``__init__``, implement
    the hooks (starting each with :meth:`_begin` or :meth:`_operation`); ``close`` sets ``_closed``.
    """

    #: The backend's name in messages.
    BACKEND: ClassVar[str] = "data-plane"

    #: The lock a data operation holds (``None``: the backend needs none).
    _lock: Any = None

    _bootstrap: bool
    _closed: bool
    _used: bool
    _poll_s: float  # seconds between claim attempts (backends that poll)

    def _init_lifetime(self, bootstrap: bool, *, closed: bool) -> None:
        self._bootstrap = bool(bootstrap)
        self._closed = closed
        self._used = False

    @property
    def is_bootstrap(self) -> bool:
        """Whether this client created (and on close tears down) the backend's shared state."""
        return self._bootstrap

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise closed_error(self.BACKEND)

    def _begin(self) -> None:
        """Start a data operation: the client must be open, and is no longer clean."""
        self._check_open()
        self._used = True

    @contextmanager
    def _operation(self) -> Iterator[None]:
        """Hold the client's lock (if it has one) and :meth:`_begin` a data operation."""
        with self._lock if self._lock is not None else nullcontext():
            self._begin()
            yield

    # --- the public calls (contracts on ``DataPlaneClient``) -----------------------------------
    def register_partition(
        self, partition_id: str, fields: Sequence[str], num_samples: int, consumer_tasks: Sequence[str],
        grpo_group_size: int | None = None, enums: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._register(partition_id, fields, num_samples, consumer_tasks, grpo_group_size, enums)

    def claim_meta(
        self, partition_id: str, task_name: str, required_fields: Sequence[str], batch_size: int,
        dp_rank: int | None = None, blocking: bool = True, timeout_s: float = 60.0,
    ) -> KVBatchMeta:
        del dp_rank
        return self._claim(partition_id, task_name, required_fields, batch_size, blocking, timeout_s)

    def check_consumption_status(self, partition_id: str, task_names: Sequence[str]) -> bool:
        return self._consumed(partition_id, task_names)

    def put_samples(
        self, sample_ids: Sequence[str], partition_id: str, fields: TensorDict | None = None,
        tags: Sequence[dict] | None = None,
    ) -> KVBatchMeta:
        return self._put(sample_ids, partition_id, fields, tags)

    def get_samples(self, sample_ids: Sequence[str], partition_id: str, select_fields: Sequence[str]) -> TensorDict:
        return self._get(sample_ids, partition_id, select_fields)

    def list_sample_ids(self, partition_id: str) -> list[str]:
        return self._list_ids(partition_id)

    def clear_samples(self, sample_ids: Sequence[str] | None, partition_id: str) -> None:
        self._clear(sample_ids, partition_id)

    # --- the backend's hooks (arguments as the public call received them) -------------------
    @abc.abstractmethod
    def _register(self, partition_id: Any, fields: Any, n: Any, tasks: Any, group_size: Any, enums: Any) -> None:
        """The backend's ``register_partition``."""

    @abc.abstractmethod
    def _claim(self, partition_id: Any, task: Any, fields: Any, n: Any, blocking: bool, timeout_s: Any) -> KVBatchMeta:
        """The backend's ``claim_meta`` (``dp_rank`` dropped)."""

    @abc.abstractmethod
    def _consumed(self, partition_id: Any, task_names: Any) -> bool:
        """The backend's ``check_consumption_status``."""

    @abc.abstractmethod
    def _put(self, sample_ids: Any, partition_id: Any, fields: Any, tags: Any) -> KVBatchMeta:
        """The backend's ``put_samples``."""

    @abc.abstractmethod
    def _get(self, sample_ids: Any, partition_id: Any, select_fields: Any) -> TensorDict:
        """The backend's ``get_samples``."""

    @abc.abstractmethod
    def _list_ids(self, partition_id: Any) -> list[str]:
        """The backend's ``list_sample_ids``."""

    @abc.abstractmethod
    def _clear(self, sample_ids: Any, partition_id: Any) -> None:
        """The backend's ``clear_samples``."""

    def _require_owner(self, op: str) -> None:
        """``RuntimeError`` for ``op`` on a client that attached instead of bootstrapping."""
        if not self._bootstrap:
            raise RuntimeError(
                f"{op} is only available on the bootstrapping {self.BACKEND} client (the "
                "driver); this client attached with bootstrap=False"
            )

    def _require_known(self, partition_id: str) -> None:
        """Raise ``KeyError`` unless ``partition_id`` is registered (argument-error precedence)."""
        raise NotImplementedError

    @staticmethod
    def _read_args(
        sample_ids: Any, select_fields: Any, require_partition: Callable[[], object]
    ) -> tuple[list[str], list[str]]:
        """``check_read_args``; an unknown partition (``require_partition`` raises) outranks its errors."""
        try:
            ids, names = check_read_args(sample_ids, select_fields)
        except (TypeError, ValueError):
            require_partition()
            raise
        if not ids:
            require_partition()
        return ids, names

    def get_data(self, meta: KVBatchMeta, select_fields: Sequence[str] | None = None) -> TensorDict:
        self._begin()
        check_meta(meta)
        try:
            fields = get_data_fields(meta, select_fields)
        except ValueError:
            self._require_known(meta.partition_id)
            raise
        return self.get_samples(meta.sample_ids, meta.partition_id, fields)

    def _poll_claim(
        self,
        attempt: Callable[[], tuple[list[str], list[dict[str, Any]] | None]],
        partition_id: str,
        task_name: str,
        fields: Any,
        batch_size: int,
        blocking: bool,
        timeout_s: Any,
    ) -> KVBatchMeta:
        """Run a claim ``attempt`` (claimed ids, empty when too few are ready, and their tags) every
        ``self._poll_s`` seconds until it claims rows; ``TimeoutError`` when ``blocking`` and none came in time.
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
            time.sleep(min(self._poll_s, remaining))

    def _begin_load(self) -> None:
        """Start a ``load_checkpoint``: ``RuntimeError`` unless the client is clean (no data operation, no load)."""
        if self._used:
            raise RuntimeError(
                "load_checkpoint needs a clean data-plane client: a data operation or a load "
                "already ran on this client; build a new client to load into"
            )
        self._used = True


def coerce_dataclass_config(cfg: Any, cls: type[C], client: str) -> C:
    """``cfg`` (a ``cls``, or a mapping / ``DictConfig`` of its keys) as a validated ``cls``.

    Raises:
        TypeError: ``cfg`` is neither (``client`` names the client).
        ValueError: A key is unknown or out of range.
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
