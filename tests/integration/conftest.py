"""Session fixtures for the integration tier: one Ray cluster and one TransferQueue system.

Why this module exists: starting Ray plus the TransferQueue controller and storage unit costs
10-20 s on the shared 2-core machine, so every integration test shares one session cluster
(``ray_cluster``) and one bootstrapping data-plane client (``tq_session`` / ``tq_client``),
torn down in ``finally`` at session end (client first, then ``ray.shutdown()``).

Ray runs with ``num_cpus=2``: the TransferQueue controller and its single storage unit reserve
both logical CPUs, so every actor a test starts must request ``num_cpus=0``.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nemo_dp.data_plane.interfaces import DataPlaneConfig, SimpleStorageConfig

RAY_NUM_CPUS = 2


def tq_test_config(**simple: Any) -> DataPlaneConfig:
    """The session's TransferQueue config: the adapter's defaults with one storage unit.

    Args:
        **simple: Overrides for ``data_plane.simple`` (e.g. ``storage_capacity``).

    Returns:
        A validated ``DataPlaneConfig``.
    """
    params: dict[str, Any] = {"num_storage_units": 1}
    params.update(simple)
    return DataPlaneConfig(simple=SimpleStorageConfig(**params))


class BootstrapSession:
    """Holds a backend's bootstrapping client and can replace it with a fresh, empty system.

    Tests that need a clean system (checkpoint loads, close semantics) call ``fresh()``; the
    next ``client`` access re-bootstraps if the current one was closed, so later tests always
    get a live session client.

    Args:
        bootstrap: Builds a new bootstrapping client (a new, empty system).
    """

    def __init__(self, bootstrap: Callable[[], Any]) -> None:
        self._bootstrap = bootstrap
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The live bootstrapping client (created on first use or after close)."""
        if self._client is None or self._client.closed:
            self._client = self._bootstrap()
        return self._client

    def close(self) -> None:
        """Close the current client (tears the backend's actors down); idempotent."""
        if self._client is not None:
            try:
                self._client.close()
            finally:
                self._client = None

    def fresh(self) -> Any:
        """Close the current system and bootstrap a new, empty one.

        Returns:
            The new bootstrapping client.
        """
        self.close()
        return self.client


class TQSession(BootstrapSession):
    """The session's TransferQueue system (``TQDataPlaneClient`` bootstrapping ``cfg``)."""

    def __init__(self, cfg: DataPlaneConfig) -> None:
        from nemo_dp.data_plane.adapters.transfer_queue import TQDataPlaneClient

        super().__init__(lambda: TQDataPlaneClient(cfg, bootstrap=True))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[dict[str, str]]:
    """Ray for the whole session (``num_cpus=2``), with the TransferQueue knobs exported."""
    from nemo_dp.data_plane.registry import ray_start_args
    from nemo_dp.distributed.ray_init import init_ray, shutdown_ray

    env = init_ray(num_cpus=RAY_NUM_CPUS, **ray_start_args(tq_test_config()))
    try:
        yield env
    finally:
        shutdown_ray()


@pytest.fixture(scope="session")
def tq_session(ray_cluster: dict[str, str]) -> Iterator[TQSession]:
    """The session's TransferQueue system holder; closed before Ray shuts down."""
    session = TQSession(tq_test_config())
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def tq_client(tq_session: TQSession) -> Any:
    """The live session bootstrapping client (function-scoped view of the session system).

    The system itself lives for the whole session; this fixture only re-resolves it so that a
    test that replaced it (``tq_session.fresh()``) never leaves later tests a closed client.
    """
    return tq_session.client


@pytest.fixture
def tq_pid() -> str:
    """A partition id unique to the test (partitions are cluster-wide)."""
    return f"it_{uuid.uuid4().hex[:12]}"


#: The tiny TransferQueue RL run of the trainer-level tests (2 workers, 1-digit addition, no warm
#: start, held-out accuracy not at start); each file adds its batch shapes and algorithm keys.
TINY_TQ_RL: tuple[str, ...] = (
    "~recipe",
    "data_plane=tq",
    "policy.dp_size=2",
    "policy.model.n_layers=1",
    "policy.model.d_model=32",
    "policy.model.n_heads=2",
    "policy.model.max_seq_len=16",
    "policy.generation.max_new_tokens=4",
    "policy.optimizer.warmup_steps=0",
    "env.digits=1",
    "algorithm.val_at_start=false",
    "algorithm.val_samples=4",
    "algorithm.warm_start.enabled=false",
)


def compose_tiny_tq_rl(*overrides: str) -> Any:
    """``TINY_TQ_RL`` composed with the project's configs, ``overrides`` last.

    Args:
        *overrides: Further Hydra overrides.

    Returns:
        The composed ``DictConfig``.
    """
    from tests.compose import compose_run

    return compose_run([*TINY_TQ_RL, *overrides])


@contextlib.contextmanager
def observed_tq_policy(ray_cluster: dict[str, str], tq_session: TQSession, policy_cfg: Any) -> Iterator[Any]:
    """A ``TQPolicy`` with data-plane observability on, from the factory, on the session cluster.

    The session's TransferQueue client is closed first (one open client per process: the
    policy bootstraps its own system); the policy is shut down on exit.

    Args:
        ray_cluster: The session's worker environment.
        tq_session: The session's TransferQueue holder.
        policy_cfg: The ``policy`` node of a composed config (the character tokenizer's vocabulary).

    Yields:
        The policy.
    """
    from nemo_dp.data_plane.factory import make_policy_factory
    from nemo_dp.data_plane.interfaces import ObservabilityConfig
    from nemo_dp.distributed.worker_group import RayCluster
    from nemo_dp.models.tiny.tokenizer import CharTokenizer

    tq_session.close()
    dp_cfg = DataPlaneConfig(simple=SimpleStorageConfig(num_storage_units=1), observability=ObservabilityConfig(enabled=True))
    factory = make_policy_factory(dp_cfg)
    assert factory is not None
    tok = CharTokenizer()
    policy = factory(
        cluster=RayCluster(env_vars=dict(ray_cluster)),
        config=policy_cfg,
        vocab_size=tok.vocab_size,
        pad_id=tok.pad_id,
        eos_id=tok.eos_id,
        seed=3,
    )
    try:
        yield policy
    finally:
        policy.shutdown()
