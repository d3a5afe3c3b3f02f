"""The backend registry and the algorithm registry, through the code that reads them.

The checks go through the factory, the config layer and the colocated loader's group rather
than restating the tables: a backend or algorithm registered here in a test (a tiny module in
``tmp_path`` standing in for an adapter or a trainer; it isolates the lookup from Ray and
models) must become selectable everywhere without any other edit.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Any

import pytest
from omegaconf import OmegaConf

from nemo_dp.config import algorithm_registry as algos
from nemo_dp.config import trainer_lookup
from nemo_dp.data_plane import factory, registry
from nemo_dp.data_plane.interfaces import (
    DataPlaneConfig,
    DisabledDataPlaneConfig,
    LocalDataPlaneConfig,
    ObservabilityConfig,
    PartitionLimitError,
    SimpleStorageConfig,
)

TQ = {"enabled": True, "impl": "transfer_queue", "simple": {"num_storage_units": 1}}


# --- backends ---------------------------------------------------------------------------------


def test_each_hydra_option_has_a_schema_and_a_yaml() -> None:
    conf = Path(__file__).resolve().parents[2] / "conf" / "data_plane"
    options = sorted(spec.option for spec in registry.BACKENDS.values())
    assert options == sorted(p.stem for p in conf.glob("*.yaml"))
    for spec in registry.BACKENDS.values():
        defaults = OmegaConf.load(conf / f"{spec.option}.yaml")["defaults"]
        assert defaults[0] == f"/data_plane_{spec.option}_schema@_here_"


@pytest.mark.parametrize(
    ("cfg", "cpus"),
    [
        (None, 0),
        ({"enabled": False}, 0),
        (LocalDataPlaneConfig(), 0),
        (TQ, 2),
        ({**TQ, "simple": {"num_storage_units": 3}}, 4),
        (DataPlaneConfig(enabled=False, simple=SimpleStorageConfig(num_storage_units=5)), 0),
    ],
)
def test_reserved_ray_cpus(cfg: Any, cpus: int) -> None:
    assert registry.reserved_ray_cpus(cfg) == cpus


def test_ray_start_args_carry_cpus_reason_and_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    from nemo_dp.data_plane.adapters import transfer_queue_env as tqenv

    for knob in tqenv.ENGINE_KNOBS:
        monkeypatch.delenv(knob.env_var, raising=False)
    monkeypatch.delitem(sys.modules, "transfer_queue", raising=False)
    args = registry.ray_start_args({**TQ, "simple": {"num_storage_units": 2}})
    assert args["reserved_cpus"] == 3
    assert "data_plane.simple.num_storage_units=2" in args["reserved_by"]
    assert set(args["worker_env"]) == {k.env_var for k in tqenv.ENGINE_KNOBS}
    assert registry.ray_start_args(LocalDataPlaneConfig()) == {
        "reserved_cpus": 0,
        "reserved_by": "no data-plane actors",
        "worker_env": {},
    }


def test_reserved_ray_cpus_names_a_bad_key() -> None:
    with pytest.raises(ValueError, match="data_plane.simple.num_storage_units"):
        registry.reserved_ray_cpus({**TQ, "simple": {"num_storage_units": "many"}})


def test_capabilities_seen_by_their_readers() -> None:
    from nemo_dp.algorithms.sft_loader import ColocatedLoaderGroup

    class _Group:
        world_size = 2

    class _Policy:
        worker_group = _Group()

    local = ColocatedLoaderGroup(_Policy(), LocalDataPlaneConfig(max_partitions=3))
    tq = ColocatedLoaderGroup(_Policy(), OmegaConf.create(TQ))
    assert local.max_live_batches() == 3
    assert tq.max_live_batches() == registry.LOADER_LIVE_BATCHES
    assert local.backend.checkpoint_scope == "process" and not local.backend.cross_process
    assert tq.backend.checkpoint_scope == "cluster" and tq.backend.cross_process
    assert tq._shared_dir("/ck") == Path("/ck") / "tq"
    with pytest.raises(ValueError, match="data_plane=local or data_plane=tq"):
        ColocatedLoaderGroup(_Policy(), DisabledDataPlaneConfig())


def test_register_backend_refuses_a_clash() -> None:
    with pytest.raises(ValueError, match="clashes"):
        registry.register_backend(
            registry.BackendSpec(kind="other", option="tq", schema=type("S", (), {}), client_target="m:f")
        )
    with pytest.raises(ValueError, match="unknown data-plane backend kind 'nope'"):
        registry.backend("nope")
    with pytest.raises(ValueError, match="unknown data_plane option 'nope'"):
        registry.backend_for_option("nope")


def test_partition_limit_error_is_typed_and_a_runtime_error() -> None:
    client = factory.build_data_plane_client(LocalDataPlaneConfig(max_partitions=1))
    try:
        client.register_partition("a", fields=["x"], num_samples=1, consumer_tasks=["t"])
        with pytest.raises(PartitionLimitError, match="partition limit") as info:
            client.register_partition("b", fields=["x"], num_samples=1, consumer_tasks=["t"])
        assert isinstance(info.value, RuntimeError)
        client.clear_samples(None, "a")
        # Nothing of the refused registration exists: "b" registers cleanly now.
        client.register_partition("b", fields=["x"], num_samples=1, consumer_tasks=["t"])
    finally:
        client.close()


def _test_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    """Write module ``name`` under ``tmp_path``, importable (freshly) for this test only; return its name."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


@dataclass
class MemoConfig:
    """Schema of the test-only backend below."""

    enabled: bool = True
    impl: str = "memo"
    slots: int = 4
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)


_MEMO_CLIENT_MODULE = """\
from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
from nemo_dp.data_plane.interfaces import LocalDataPlaneConfig
def build(cfg, *, bootstrap, checkpointing):
    client = LocalDataPlaneClient(LocalDataPlaneConfig(max_partitions=cfg.slots))
    client.built_with = (bootstrap, checkpointing)
    return client
"""


@pytest.fixture
def extra_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A third backend: a schema and a client module written for this test only."""
    name = _test_module(tmp_path, monkeypatch, "fake_memo_backend", _MEMO_CLIENT_MODULE)
    spec = registry.BackendSpec(
        kind="memo", option="memo", schema=MemoConfig, client_target=f"{name}:build", checkpoint_scope="process",
        supports_checkpointing=lambda cfg: False, reserved_cpus=lambda cfg: cfg.slots,
        describe=lambda cfg: f"memo ({cfg.slots} slots)",
    )
    monkeypatch.setitem(registry.BACKENDS, "memo", spec)
    return name


def test_a_registered_backend_is_served_by_the_factory_unchanged(extra_backend: str) -> None:
    cfg = {"enabled": True, "impl": "memo", "slots": 3}
    assert factory.data_plane_kind(cfg) == "memo"
    typed = factory.coerce_data_plane_config(cfg)
    assert type(typed).__name__ == "MemoConfig" and typed.slots == 3
    with pytest.raises(ValueError, match="data_plane.slots"):
        factory.coerce_data_plane_config({**cfg, "slots": "three"})
    assert registry.reserved_ray_cpus(cfg) == 3
    assert factory.maybe_configure_data_plane_env(cfg) == {}
    assert factory.data_plane_supports_checkpointing(cfg) is False
    with pytest.raises(ValueError, match="does not support data-plane checkpoints"):
        factory.build_data_plane_client(cfg, checkpointing=True)
    client = factory.build_data_plane_client(cfg, bootstrap=False)
    try:
        assert client.built_with == (False, False)
    finally:
        client.close()
    # No algorithm serves it yet: the message lists the legal backends by their options.
    with pytest.raises(ValueError, match=r"data_plane='memo'.*disabled \(data_plane=disabled\)"):
        trainer_lookup.validate_trainer_selection({"algorithm": {"name": "grpo"}, "data_plane": cfg})


# --- algorithms -------------------------------------------------------------------------------


def test_algorithm_specs_point_at_the_input_builders() -> None:
    # The inputs module is owned elsewhere; its targets are checked as strings only.
    assert {n: s.input_builder for n, s in algos.ALGORITHMS.items()} == {
        "sft": "nemo_dp.algorithms.inputs:build_sft_inputs",
        "grpo": "nemo_dp.algorithms.inputs:build_rl_inputs",
        "ppo": "nemo_dp.algorithms.inputs:build_rl_inputs",
    }


def test_config_schema_names_come_from_the_registry() -> None:
    from nemo_dp.config.schema import ALGORITHM_NAMES, algorithm_schemas

    assert ALGORITHM_NAMES == tuple(algos.ALGORITHMS)
    assert [c.__name__ for c in algorithm_schemas()] == ["SFTConfig", "GRPOConfig", "PPOConfig"]
    for spec in algos.ALGORITHMS.values():
        assert spec.schema_class()().name == spec.name


def test_bad_specs_are_refused() -> None:
    with pytest.raises(ValueError, match="identifier"):
        algos.AlgorithmSpec(name="d-po", schema="m:C", input_builder="m:f", trainers={"disabled": "m:t"})
    with pytest.raises(ValueError, match="trainers\\['disabled'\\]"):
        algos.AlgorithmSpec(name="dpo", schema="m:C", input_builder="m:f", trainers={"disabled": "m.t"})
    with pytest.raises(ValueError, match="at least one backend"):
        algos.AlgorithmSpec(name="dpo", schema="m:C", input_builder="m:f", trainers={})
    with pytest.raises(ValueError, match="already registered"):
        algos.register_algorithm(algos.ALGORITHMS["sft"])
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        algos.algorithm("nope")


_DPO_MODULE = """\
from dataclasses import dataclass
@dataclass
class DPOConfig:
    name: str = 'dpo'
    max_steps: int = 3
    beta: float = 0.1
    def __post_init__(self):
        if self.beta <= 0:
            raise ValueError(f'algorithm.beta: must be > 0, got {self.beta!r}')
def dpo_train(*args, **kwargs):
    return 'dpo'
"""


@pytest.fixture
def dpo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new algorithm in one module (schema + trainer), registered as a user would."""
    name = _test_module(tmp_path, monkeypatch, "fake_dpo_algorithm", _DPO_MODULE)
    spec = algos.AlgorithmSpec(
        name="dpo", schema=f"{name}:DPOConfig", input_builder=f"{name}:dpo_train",
        trainers={"disabled": f"{name}:dpo_train", "transfer_queue": f"{name}:dpo_train"}, requires_cross_process=True,
    )
    monkeypatch.setitem(algos.ALGORITHMS, "dpo", spec)
    return name


def test_a_registered_algorithm_is_selectable_and_validated(
    dpo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = factory.select_sync_trainer({"algorithm": {"name": "dpo"}, "data_plane": TQ})
    assert trainer() == "dpo"
    assert capsys.readouterr().out == "Running synchronous DPO training (data plane: transfer_queue)\n"
    with pytest.raises(ValueError, match="process-local store cannot carry rollout data"):
        trainer_lookup.validate_trainer_selection({"algorithm": {"name": "dpo"}, "data_plane": LocalDataPlaneConfig()})

    from hydra.core.config_store import ConfigStore

    from nemo_dp.config import register_configs
    from nemo_dp.config.schema import MasterConfig, algorithm_schemas

    register_configs()
    assert "algorithm_dpo_schema.yaml" in ConfigStore.instance().list("")
    assert [c.__name__ for c in algorithm_schemas()][-1] == "DPOConfig"
    dpo_cfg = algos.ALGORITHMS["dpo"].schema_class()
    with pytest.raises(ValueError, match="algorithm: unknown algorithm schema str"):
        MasterConfig(algorithm="dpo", data_plane=None, policy=None, env=None, cluster=None, logger=None, checkpointing=None)  # type: ignore[arg-type]
    MasterConfig(algorithm=dpo_cfg(), data_plane=None, policy=None, env=None, cluster=None, logger=None, checkpointing=None)  # type: ignore[arg-type]


# --- rewards ----------------------------------------------------------------------------------


@pytest.fixture
def starts_with_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A new reward in one module: its score and its answer extraction, registered on import."""
    from nemo_dp.environments import registry as rewards

    name = "fake_prefix_reward"
    (tmp_path / f"{name}.py").write_text(
        "import torch\n"
        "from nemo_dp.environments import RewardSpec, register_reward\n"
        "def first_word(response):\n"
        "    return response.split()[0] if response.split() else None\n"
        "class FirstWord:\n"
        "    def score(self, responses, answers):\n"
        "        return torch.tensor([float(first_word(r) == a) for r, a in zip(responses, answers)])\n"
        "register_reward(RewardSpec('first_word', FirstWord, first_word))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield name, tmp_path
    rewards.REWARDS.pop("first_word", None)


def test_a_registered_reward_is_a_legal_setting_scores_and_is_evaluated(
    starts_with_reward: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    from nemo_dp.config.env import EnvConfig, RewardItem
    from nemo_dp.environments import make_environment
    from nemo_dp.models.tiny.tokenizer import CharTokenizer
    from nemo_dp.training import evaluate

    name, folder = starts_with_reward
    with pytest.raises(ValueError, match="env.reward: got 'first_word'"):
        EnvConfig(reward="first_word")
    importlib.import_module(name)
    assert [p.name for p in folder.iterdir() if p.suffix == ".py"] == [f"{name}.py"]  # the one file it needed
    env = make_environment(EnvConfig(reward="first_word"))
    assert env.score(["42 is it", "4 2"], ["42", "42"]).tolist() == [1.0, 0.0]
    listed = make_environment(EnvConfig(rewards=[RewardItem(fn="first_word", weight=2.0), RewardItem(fn="exact")]))
    assert listed.score(["42 x", "42"], ["42", "42"]).tolist() == [2.0, 3.0]
    # Evaluation reports the answer this reward extracts, with no list of its own to extend.
    run_cfg = OmegaConf.create({"env": {"reward": "first_word", "digits": 1, "operators": ["+"], "seed": 0,
                                         "format": "plain"}, "algorithm": {"name": "sft", "val_samples": 2}})
    monkeypatch.setattr(evaluate, "phase_config", lambda ref: run_cfg)
    data = evaluate.eval_problems(None, evaluate.EvalOptions(), CharTokenizer())  # type: ignore[arg-type]
    assert data.extract("7 is the answer") == "7" and len(data.problems) == 2
