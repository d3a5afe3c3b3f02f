"""The open/closed/bootstrap plumbing every data-plane client shares, and config coercion.

:class:`BaseDataPlaneClient` keeps a client's lifetime flags (closed, used, bootstrapping) and
the errors that go with them, so that each adapter's client only moves its bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from nemo_dp.data_plane.adapters._validation import closed_error
from nemo_dp.data_plane.interfaces import DataPlaneClient

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
