"""Factory and TQ knob tests.

Trainers and ``TQPolicy`` need Ray and a model, so the selection tests point the registry (or
the policy path) at tiny modules written into ``tmp_path``: those fakes isolate the factory's
lookup/import/print logic from the trainers themselves.  The real registry table is checked
separately against the contract.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_dp.algorithms import selection
from nemo_dp.algorithms.selection import describe_selection, make_policy_factory, select_sync_trainer
from nemo_dp.config import trainer_lookup
from nemo_dp.config.trainer_lookup import TrainerNotAvailableError, validate_trainer_selection
from nemo_dp.data_plane import factory
from nemo_dp.data_plane.adapters import transfer_queue_env as tqenv
from nemo_dp.data_plane.factory import (
    build_data_plane_client,
    coerce_data_plane_config,
    data_plane_enabled,
    data_plane_supports_checkpointing,
    maybe_configure_data_plane_env,
)
from nemo_dp.utils.imports import resolve_target
from nemo_dp.data_plane.interfaces import (
    DataPlaneConfig,
    DisabledDataPlaneConfig,
    LocalDataPlaneConfig,
    SimpleStorageConfig,
    TimeoutsConfig,
)

KNOBS = [k.env_var for k in tqenv.ENGINE_KNOBS]
TQ_DICT = {"enabled": True, "impl": "transfer_queue", "simple": {"num_storage_units": 1}}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    # delenv records the original state, so teardown also undoes writes by the code under test.
    for name in KNOBS:
        monkeypatch.delenv(name, raising=False)
    # In a full `pytest tests` run the integration tier has already imported the library into
    # this process; these tests are about the not-yet-imported case, so hide it (restored after).
    monkeypatch.delitem(sys.modules, "transfer_queue", raising=False)


def _tq_cfg(**timeouts: float) -> DataPlaneConfig:
    return DataPlaneConfig(
        simple=SimpleStorageConfig(num_storage_units=1), timeouts=TimeoutsConfig(**timeouts)
    )


# --- data_plane_enabled ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        None,
        {},
        {"impl": "transfer_queue"},
        {"enabled": False, "impl": "transfer_queue"},
        DisabledDataPlaneConfig(),
        LocalDataPlaneConfig(enabled=False),
        OmegaConf.create({"enabled": False}),
    ],
)
def test_data_plane_enabled_false(cfg: object) -> None:
    assert data_plane_enabled(cfg) is False


@pytest.mark.parametrize(
    "cfg",
    [
        {"enabled": True, "impl": "local"},
        LocalDataPlaneConfig(),
        OmegaConf.create(TQ_DICT),
    ],
)
def test_data_plane_enabled_true(cfg: object) -> None:
    assert data_plane_enabled(cfg) is True


def test_data_plane_enabled_rejects_non_bool() -> None:
    with pytest.raises(TypeError, match="data_plane.enabled"):
        data_plane_enabled({"enabled": "yes", "impl": "local"})


# --- coercion ----------------------------------------------------------------------------------


def test_coerce_forms() -> None:
    assert coerce_data_plane_config(None) == DisabledDataPlaneConfig()
    assert coerce_data_plane_config({"enabled": False, "impl": "x"}) == DisabledDataPlaneConfig()
    local = LocalDataPlaneConfig(max_partitions=1)
    assert coerce_data_plane_config(local) is local
    assert coerce_data_plane_config({"enabled": True, "impl": "local"}) == LocalDataPlaneConfig()
    tq = coerce_data_plane_config(OmegaConf.create(TQ_DICT))
    assert isinstance(tq, DataPlaneConfig)
    assert tq.simple.num_storage_units == 1
    assert tq == _tq_cfg()


def test_coerce_errors_name_key() -> None:
    with pytest.raises(ValueError, match="unknown data_plane impl: 'nope'"):
        coerce_data_plane_config({"enabled": True, "impl": "nope"})
    with pytest.raises(ValueError, match="unknown data_plane impl: None"):
        coerce_data_plane_config({"enabled": True})
    with pytest.raises(ValueError, match=r"data_plane\.simple\.num_storage_units"):
        coerce_data_plane_config({"enabled": True, "impl": "transfer_queue"})
    with pytest.raises(ValueError, match=r"data_plane\.bogus"):
        coerce_data_plane_config({**TQ_DICT, "bogus": 1})
    with pytest.raises(ValueError, match=r"data_plane\.max_partitions"):
        coerce_data_plane_config({"enabled": True, "impl": "local", "max_partitions": 0})
    with pytest.raises(TypeError, match="data_plane config"):
        coerce_data_plane_config(42)


# --- build_data_plane_client -------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [None, {"enabled": False, "impl": "transfer_queue"}, DisabledDataPlaneConfig(), _tq_cfg()],
    ids=["none", "dict-disabled", "disabled-dataclass", "tq-enabled-false"],
)
def test_build_disabled_raises(cfg: object) -> None:
    if isinstance(cfg, DataPlaneConfig):
        cfg = dataclasses.replace(cfg, enabled=False)
    with pytest.raises(ValueError) as info:
        build_data_plane_client(cfg)
    assert "disabled" in str(info.value)
    assert "legacy" in str(info.value)


@pytest.mark.parametrize("impl", ["noop", "no_such_thing"])
def test_build_unknown_impl(impl: str) -> None:
    with pytest.raises(ValueError, match="unknown data_plane impl"):
        build_data_plane_client({"enabled": True, "impl": impl})


def test_build_local_from_plain_dict() -> None:
    from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
    from nemo_dp.data_plane.observability import MetricsDataPlaneClient

    client = build_data_plane_client({"enabled": True, "impl": "local"})
    try:
        assert type(client) is LocalDataPlaneClient
        assert not isinstance(client, MetricsDataPlaneClient)
    finally:
        client.close()


def test_build_local_wrapped_when_observability_enabled(caplog: pytest.LogCaptureFixture) -> None:
    from nemo_dp.data_plane.adapters.local import LocalDataPlaneClient
    from nemo_dp.data_plane.observability import MetricsDataPlaneClient, is_metrics_client

    client = build_data_plane_client(
        {"enabled": True, "impl": "local", "observability": {"enabled": True, "log_events": True}}
    )
    try:
        assert isinstance(client, MetricsDataPlaneClient)
        assert is_metrics_client(client)
        assert type(client.inner) is LocalDataPlaneClient
        with caplog.at_level(logging.INFO, logger="nemo_dp.data_plane.observability"):
            client.register_partition("p", fields=[], num_samples=1, consumer_tasks=[])
        assert any("data_plane_event: " in r.getMessage() for r in caplog.records)
    finally:
        client.close()


def test_build_local_limit_from_config() -> None:
    """Checklist 27: the config reaches the adapter (max_partitions=1)."""
    client = build_data_plane_client(LocalDataPlaneConfig(max_partitions=1))
    try:
        client.register_partition("a", fields=[], num_samples=1, consumer_tasks=[])
        with pytest.raises(RuntimeError, match="partition limit"):
            client.register_partition("b", fields=[], num_samples=1, consumer_tasks=[])
    finally:
        client.close()


def test_supports_checkpointing() -> None:
    assert data_plane_supports_checkpointing({"enabled": True, "impl": "local"}) is True
    assert data_plane_supports_checkpointing(_tq_cfg()) is True
    assert data_plane_supports_checkpointing(None) is False


# --- select_sync_trainer ---------------------------------------------------------------------

def test_every_registered_trainer_resolves_to_a_callable() -> None:
    """Each (algorithm, backend) entry the factory serves imports and is a function; the pairs
    come from the algorithm registry, and a process-local backend serves no RL algorithm."""
    from nemo_dp.config.algorithm_registry import ALGORITHMS

    table = trainer_lookup.TRAINER_REGISTRY
    assert set(table) == {(n, k) for n, spec in ALGORITHMS.items() for k in spec.trainers}
    for (alg, kind), target in table.items():
        trainer = resolve_target(target, f"{alg}/{kind}")
        assert callable(trainer) and trainer.__name__ == target.rpartition(":")[2]
    assert {(a, k) for a, k in table if k == "local"} == {("sft", "local")}


@pytest.fixture
def fake_trainers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of stand-in trainers; isolates selection from the real (Ray-bound) trainers."""
    name = f"fake_trainers_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "def legacy(*a, **k):\n    return 'legacy'\n\ndef sync(*a, **k):\n    return 'sync'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for alg, kind in list(trainer_lookup.TRAINER_REGISTRY):
        target = f"{name}:legacy" if kind == "disabled" else f"{name}:sync"
        monkeypatch.setitem(trainer_lookup.TRAINER_REGISTRY, (alg, kind), target)
    return name


@pytest.mark.parametrize(
    "master, expected, line",
    [
        ({"algorithm": {"name": "grpo"}}, "legacy", "Running synchronous GRPO training (legacy)"),
        (
            {"algorithm": {"name": "grpo"}, "data_plane": {"enabled": False}},
            "legacy",
            "Running synchronous GRPO training (legacy)",
        ),
        (
            {"algorithm": {"name": "grpo"}, "data_plane": TQ_DICT},
            "sync",
            "Running synchronous GRPO training (data plane: transfer_queue)",
        ),
        (
            {"algorithm": "sft", "data_plane": {"enabled": True, "impl": "local"}},
            "sync",
            "Running synchronous SFT training (data plane: local)",
        ),
        (
            {"algorithm": {"name": "ppo"}, "data_plane": None},
            "legacy",
            "Running synchronous PPO training (legacy)",
        ),
    ],
)
def test_select_sync_trainer(
    fake_trainers: str,
    capsys: pytest.CaptureFixture[str],
    master: dict,
    expected: str,
    line: str,
) -> None:
    trainer = select_sync_trainer(OmegaConf.create(master))
    assert trainer() == expected
    out = capsys.readouterr().out
    assert out.splitlines() == [line]


@pytest.mark.parametrize(
    "master, expected, line",
    [
        ({}, "legacy", "Running synchronous GRPO training (legacy)"),
        ({"data_plane": None}, "legacy", "Running synchronous GRPO training (legacy)"),
        ({"algorithm": None, "data_plane": {"enabled": False}}, "legacy", "Running synchronous GRPO training (legacy)"),
        ({"data_plane": TQ_DICT}, "sync", "Running synchronous GRPO training (data plane: transfer_queue)"),
    ],
)
def test_select_sync_trainer_without_algorithm_node_is_grpo(
    fake_trainers: str, capsys: pytest.CaptureFixture[str], master: dict, expected: str, line: str
) -> None:
    """Issue 10 item 4: like the reference, a config without ``algorithm`` selects GRPO."""
    trainer = select_sync_trainer(OmegaConf.create(master))
    assert trainer() == expected
    assert capsys.readouterr().out.splitlines() == [line]


def test_selection_without_algorithm_node_names_the_real_grpo_trainers() -> None:
    assert validate_trainer_selection({"data_plane": None}).target == "nemo_dp.algorithms.grpo:grpo_train"
    sel = validate_trainer_selection(OmegaConf.create({"data_plane": TQ_DICT}))
    assert (sel.algorithm, sel.label) == ("grpo", "GRPO")
    assert sel.target == "nemo_dp.algorithms.grpo_sync:grpo_train_sync"
    assert validate_trainer_selection({}, label="VLM GRPO").progress_line == "Running synchronous VLM GRPO training (legacy)"


def test_select_sync_trainer_label_and_dataclass_master(
    fake_trainers: str, capsys: pytest.CaptureFixture[str]
) -> None:
    @dataclasses.dataclass
    class Algo:
        name: str = "grpo"

    @dataclasses.dataclass
    class Master:
        algorithm: Algo = dataclasses.field(default_factory=Algo)
        data_plane: DataPlaneConfig = dataclasses.field(default_factory=_tq_cfg)

    trainer = select_sync_trainer(Master(), label="GRPO-warm")
    assert trainer() == "sync"
    assert capsys.readouterr().out.splitlines() == [
        "Running synchronous GRPO-warm training (data plane: transfer_queue)"
    ]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_local_with_rl_algorithm_is_illegal(
    fake_trainers: str, capsys: pytest.CaptureFixture[str], algorithm: str
) -> None:
    master = {"algorithm": {"name": algorithm}, "data_plane": {"enabled": True, "impl": "local"}}
    for call in (select_sync_trainer, validate_trainer_selection):
        with pytest.raises(ValueError) as info:
            call(master)
        msg = str(info.value)
        assert "algorithm" in msg and "data_plane" in msg
        assert "'local'" in msg
        assert "disabled" in msg and "transfer_queue" in msg
    assert capsys.readouterr().out == ""


def test_unknown_algorithm_and_missing_algorithm() -> None:
    with pytest.raises(ValueError, match="unknown algorithm 'dpo'.*known algorithms"):
        validate_trainer_selection({"algorithm": {"name": "dpo"}})
    with pytest.raises(ValueError, match="algorithm.name is missing"):
        validate_trainer_selection({"algorithm": {}, "data_plane": None})
    with pytest.raises(ValueError, match="unknown data_plane impl"):
        validate_trainer_selection(
            {"algorithm": "grpo", "data_plane": {"enabled": True, "impl": "x"}}
        )


def test_validate_does_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        trainer_lookup.TRAINER_REGISTRY, ("grpo", "transfer_queue"), "nemo_dp_no_such_module:fn"
    )
    sel = validate_trainer_selection({"algorithm": {"name": "grpo"}, "data_plane": TQ_DICT})
    assert sel.target == "nemo_dp_no_such_module:fn"
    assert "nemo_dp_no_such_module" not in sys.modules


def test_trainer_not_landed_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(
        trainer_lookup.TRAINER_REGISTRY, ("grpo", "transfer_queue"), "nemo_dp_no_such_module:fn"
    )
    with pytest.raises(
        TrainerNotAvailableError, match="is not available.*nemo_dp_no_such_module"
    ):
        select_sync_trainer({"algorithm": {"name": "grpo"}, "data_plane": TQ_DICT})
    monkeypatch.setitem(trainer_lookup.TRAINER_REGISTRY, ("grpo", "transfer_queue"), "json:no_such_fn")
    with pytest.raises(TrainerNotAvailableError, match="no attribute 'no_such_fn'"):
        select_sync_trainer({"algorithm": {"name": "grpo"}, "data_plane": TQ_DICT})
    assert capsys.readouterr().out == ""


def test_describe_selection() -> None:
    legacy = describe_selection({"algorithm": {"name": "sft"}})
    assert legacy == {
        "backend": "none (data plane disabled)",
        "trainer": "nemo_dp.algorithms.sft:sft_train",
        "policy_factory": "plain policy (no data plane)",
    }
    tq = describe_selection({"algorithm": {"name": "grpo"}, "data_plane": TQ_DICT})
    assert tq == {
        "backend": "transfer_queue (backend: simple)",
        "trainer": "nemo_dp.algorithms.grpo_sync:grpo_train_sync",
        "policy_factory": "nemo_dp.models.policy.tq_policy:TQPolicy",
    }
    local = describe_selection(
        {"algorithm": "sft", "data_plane": {"enabled": True, "impl": "local"}}
    )
    assert local["backend"] == "local (process-local store)"


# --- make_policy_factory ---------------------------------------------------------------


def test_make_policy_factory_disabled() -> None:
    assert make_policy_factory(None) is None
    assert make_policy_factory({"enabled": False, "impl": "transfer_queue"}) is None
    assert make_policy_factory(DisabledDataPlaneConfig()) is None


@pytest.mark.parametrize(
    "cfg",
    [LocalDataPlaneConfig(), _tq_cfg(), OmegaConf.create(TQ_DICT)],
    ids=["local", "tq", "dictconfig"],
)
def test_make_policy_factory_builds_tqpolicy_with_exact_kwargs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfg: object
) -> None:
    # Stand-in for TQPolicy (the real one starts Ray workers): records its constructor kwargs.
    name = f"fake_tq_policy_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "class TQPolicy:\n    def __init__(self, **kwargs):\n        self.kwargs = kwargs\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = resolve_target(f"{name}:TQPolicy")
    monkeypatch.setattr(selection, "TQPolicy", fake)
    make = make_policy_factory(cfg)
    assert make is not None
    policy = make(cluster="c")
    assert type(policy).__name__ == "TQPolicy"
    assert policy.kwargs.keys() == {"cluster", "dp_cfg"}
    assert policy.kwargs["cluster"] == "c"
    assert policy.kwargs["dp_cfg"] is cfg


def test_make_policy_factory_validates_eagerly() -> None:
    with pytest.raises(ValueError, match="unknown data_plane impl"):
        make_policy_factory({"enabled": True, "impl": "noop"})


def test_the_factory_keeps_the_reference_selection_names() -> None:
    from nemo_dp.data_plane.factory import make_policy_factory as from_factory

    assert from_factory is make_policy_factory
    assert factory.select_sync_trainer is select_sync_trainer
    with pytest.raises(AttributeError, match="validate_trainer_selection"):
        factory.validate_trainer_selection  # noqa: B018 - only the reference names are kept


# --- maybe_configure_data_plane_env / transfer_queue_env --------------------------------


@pytest.mark.parametrize(
    "cfg", [None, {"enabled": False}, LocalDataPlaneConfig(), {"enabled": True, "impl": "local"}]
)
def test_configure_env_noop_for_disabled_and_local(clean_knobs: None, cfg: object) -> None:
    before = dict(os.environ)
    assert maybe_configure_data_plane_env(cfg) == {}
    assert dict(os.environ) == before


def test_configure_env_unknown_impl(clean_knobs: None) -> None:
    with pytest.raises(ValueError, match="unknown data_plane impl"):
        maybe_configure_data_plane_env({"enabled": True, "impl": "noop"})


EXPECTED_DEFAULT_KNOBS = {
    "TQ_NUM_THREADS": "2",
    "TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT": "10",
    "TQ_SIMPLE_STORAGE_MAX_ATTEMPTS": "1",
    "TQ_SIMPLE_STORAGE_PROBE_TIMEOUT": "5",
    "TQ_DATA_UPDATE_RESPONSE_TIMEOUT": "15",
}


@pytest.mark.parametrize("form", ["dataclass", "dict", "dictconfig"])
def test_configure_env_sets_missing_knobs(clean_knobs: None, form: str) -> None:
    forms = {"dataclass": _tq_cfg(), "dict": TQ_DICT, "dictconfig": OmegaConf.create(TQ_DICT)}
    cfg: object = forms[form]
    assert "transfer_queue" not in sys.modules
    effective = maybe_configure_data_plane_env(cfg)
    assert effective == EXPECTED_DEFAULT_KNOBS
    for name, value in EXPECTED_DEFAULT_KNOBS.items():
        assert os.environ[name] == value


def test_configure_env_keeps_exported_values(
    clean_knobs: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT", "30")
    monkeypatch.setenv("TQ_NUM_THREADS", "2")
    with caplog.at_level(logging.WARNING, logger=tqenv.__name__):
        effective = maybe_configure_data_plane_env(_tq_cfg())
    assert effective["TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT"] == "30"
    assert os.environ["TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT"] == "30"
    assert effective["TQ_DATA_UPDATE_RESPONSE_TIMEOUT"] == "15"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # TQ_NUM_THREADS agrees with the config: no warning for it
    assert "TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT" in warnings[0]


def test_exported_non_integer_knob_is_rejected_before_writing(
    clean_knobs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TQ_SIMPLE_STORAGE_PROBE_TIMEOUT", "2.5")
    with pytest.raises(ValueError, match="TQ_SIMPLE_STORAGE_PROBE_TIMEOUT='2.5'.*int"):
        maybe_configure_data_plane_env(_tq_cfg())
    assert [name for name in KNOBS if name in os.environ] == ["TQ_SIMPLE_STORAGE_PROBE_TIMEOUT"]


def test_exported_equal_value_in_other_spelling_does_not_warn(
    clean_knobs: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TQ_DATA_UPDATE_RESPONSE_TIMEOUT", " 015 ")
    with caplog.at_level(logging.WARNING, logger=tqenv.__name__):
        effective = maybe_configure_data_plane_env(_tq_cfg())
    assert effective["TQ_DATA_UPDATE_RESPONSE_TIMEOUT"] == " 015 "
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []


def test_knob_values_are_decimal_integers() -> None:
    cfg = _tq_cfg(controller_s=3.0, storage_s=120, storage_probe_s=2.0, storage_max_attempts=4)
    assert tqenv.wanted_engine_env(cfg) == {
        "TQ_NUM_THREADS": "2",
        "TQ_SIMPLE_STORAGE_SEND_RECV_TIMEOUT": "120",
        "TQ_SIMPLE_STORAGE_MAX_ATTEMPTS": "4",
        "TQ_SIMPLE_STORAGE_PROBE_TIMEOUT": "2",
        "TQ_DATA_UPDATE_RESPONSE_TIMEOUT": "3",
    }


def test_fractional_knob_rejected_naming_key(clean_knobs: None) -> None:
    with pytest.raises(ValueError, match=r"data_plane\.timeouts\.storage_s=2\.5.*int\(\)"):
        maybe_configure_data_plane_env(_tq_cfg(storage_s=2.5))
    assert all(name not in os.environ for name in KNOBS)


def test_knob_source_missing_names_key() -> None:
    with pytest.raises(ValueError, match=r"data_plane\.timeouts\.storage_probe_s"):
        tqenv.wanted_engine_env(
            {"num_threads": 2, "timeouts": {"storage_s": 1, "storage_max_attempts": 1}}
        )


def test_engine_already_imported_reflects_sys_modules() -> None:
    assert tqenv.engine_already_imported() is ("transfer_queue" in sys.modules)


@pytest.mark.timeout(120)
def test_configure_env_after_real_import_in_fresh_interpreter() -> None:
    """A missing knob after ``import transfer_queue`` is fatal; all knobs present is fine."""
    script = textwrap.dedent(
        f"""
        import os
        for name in {KNOBS!r}:
            os.environ.pop(name, None)
        import transfer_queue  # noqa: F401  (the real library, so its knobs are now fixed)
        from nemo_dp.data_plane.factory import maybe_configure_data_plane_env
        cfg = {TQ_DICT!r}
        try:
            maybe_configure_data_plane_env(cfg)
        except RuntimeError as exc:
            assert "already imported" in str(exc), exc
            assert "before" in str(exc), exc
        else:
            raise AssertionError("no RuntimeError for missing knobs after import")
        assert all(name not in os.environ for name in {KNOBS!r}), "knobs were written"
        for name, value in {EXPECTED_DEFAULT_KNOBS!r}.items():
            os.environ[name] = value
        assert maybe_configure_data_plane_env(cfg) == {EXPECTED_DEFAULT_KNOBS!r}
        print("OK")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=110
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")
