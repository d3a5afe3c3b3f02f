"""The ``data_plane`` Hydra group files compose and validate.

A small root config in ``tmp_path`` pulls the repository's ``conf/`` onto Hydra's search path
and selects one ``data_plane`` option, so the real group files and the registered schemas are
what is tested; ``OmegaConf.to_object`` runs the schemas' ``__post_init__`` checks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from nemo_dp.data_plane.factory import coerce_data_plane_config
from nemo_dp.data_plane.interfaces import (
    DataPlaneConfig,
    DisabledDataPlaneConfig,
    LocalDataPlaneConfig,
    ObservabilityConfig,
    SimpleStorageConfig,
    TimeoutsConfig,
    register_data_plane_configs,
)

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    register_data_plane_configs()
    (tmp_path / "root.yaml").write_text(
        "defaults:\n"
        "  - data_plane: disabled\n"
        "  - _self_\n"
        "hydra:\n"
        "  searchpath:\n"
        f"    - file://{CONF}\n"
    )
    return tmp_path


def _compose(conf_dir: Path, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(conf_dir), version_base=None):
        return compose(config_name="root", overrides=overrides)


def test_group_files_exist() -> None:
    assert sorted(p.name for p in (CONF / "data_plane").glob("*.yaml")) == [
        "disabled.yaml",
        "local.yaml",
        "ray.yaml",
        "tq.yaml",
    ]
    options = tuple((n, f"/data_plane_{n}_schema@_here_") for n in ("disabled", "local", "ray", "tq"))
    for name, schema in options:
        loaded = OmegaConf.load(CONF / "data_plane" / f"{name}.yaml")
        assert list(loaded.defaults) == [schema, "_self_"], name


@pytest.mark.parametrize(
    "option, expected",
    [
        ("disabled", DisabledDataPlaneConfig()),
        ("local", LocalDataPlaneConfig(max_partitions=2, observability=ObservabilityConfig())),
        (
            "tq",
            DataPlaneConfig(
                enabled=True,
                impl="transfer_queue",
                backend="simple",
                claim_meta_poll_interval_s=0.5,
                num_threads=2,
                simple=SimpleStorageConfig(storage_capacity=1_000_000, num_storage_units=1),
                timeouts=TimeoutsConfig(
                    controller_s=15.0,
                    storage_s=10.0,
                    storage_max_attempts=1,
                    storage_probe_s=5.0,
                    startup_s=60.0,
                ),
                observability=ObservabilityConfig(enabled=False, log_events=False),
            ),
        ),
    ],
)
def test_options_compose_and_convert(conf_dir: Path, option: str, expected: object) -> None:
    cfg = _compose(conf_dir, [f"data_plane={option}"])
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, dict)
    assert type(obj["data_plane"]) is type(expected)
    assert obj["data_plane"] == expected
    # The factory's coercion of the composed node agrees with OmegaConf's conversion.
    assert coerce_data_plane_config(cfg.data_plane) == expected


def test_default_choice_and_key_override(conf_dir: Path) -> None:
    cfg = _compose(conf_dir, [])
    assert OmegaConf.to_object(cfg)["data_plane"] == DisabledDataPlaneConfig()
    cfg = _compose(conf_dir, ["data_plane=tq", "data_plane.simple.storage_capacity=64"])
    assert OmegaConf.to_object(cfg)["data_plane"].simple.storage_capacity == 64


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["data_plane=tq", "data_plane.bogus=1"], "data_plane.bogus"),
        (["data_plane=local", "data_plane.simple.num_storage_units=1"], "data_plane.simple"),
        (["data_plane=disabled", "data_plane.impl=local"], "data_plane.impl"),
        (["data_plane=tq", "data_plane.num_threads=many"], "data_plane.num_threads"),
        (["data_plane=tq", "data_plane.timeouts.storage_s=soon"], "data_plane.timeouts.storage_s"),
    ],
)
def test_unknown_or_mistyped_key_fails_at_compose(
    conf_dir: Path, overrides: list[str], key: str
) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        _compose(conf_dir, overrides)
    text = f"{info.value} {info.value.__cause__}"
    assert key in text


def test_force_added_key_is_rejected_by_the_factory(conf_dir: Path) -> None:
    """Hydra's ``+key=value`` force-adds even into a struct node, and ``OmegaConf.to_object``
    then drops the key silently; the factory's coercion (run by launchers at validation time)
    is what rejects it, naming the key."""
    cfg = _compose(conf_dir, ["data_plane=tq", "+data_plane.bogus=1"])
    with pytest.raises(ValueError, match=r"data_plane\.bogus"):
        coerce_data_plane_config(cfg.data_plane)
    cfg = _compose(conf_dir, ["data_plane=local", "+data_plane.simple.num_storage_units=1"])
    with pytest.raises(ValueError, match=r"data_plane\.simple"):
        coerce_data_plane_config(cfg.data_plane)


def test_unknown_key_in_a_group_file_fails_at_compose(conf_dir: Path) -> None:
    (conf_dir / "data_plane").mkdir()
    (conf_dir / "data_plane" / "tq_typo.yaml").write_text(
        "defaults:\n  - /data_plane_tq_schema@_here_\n  - _self_\n"
        "simple:\n  num_storage_units: 1\n  storage_capacty: 5\n"
    )
    with pytest.raises(ConfigCompositionException) as info:
        _compose(conf_dir, ["data_plane=tq_typo"])
    assert "storage_capacty" in f"{info.value} {info.value.__cause__}"


def test_backend_other_names_the_key(conf_dir: Path) -> None:
    cfg = _compose(conf_dir, ["data_plane=tq", "data_plane.backend=other"])
    with pytest.raises(ValueError, match=r"data_plane\.backend.*'other'"):
        OmegaConf.to_object(cfg)


def test_max_partitions_zero_names_the_key(conf_dir: Path) -> None:
    cfg = _compose(conf_dir, ["data_plane=local", "data_plane.max_partitions=0"])
    with pytest.raises(ValueError, match=r"data_plane\.max_partitions"):
        OmegaConf.to_object(cfg)


def test_missing_num_storage_units_names_the_key(conf_dir: Path) -> None:
    cfg = _compose(conf_dir, ["data_plane=tq", "data_plane.simple.num_storage_units=???"])
    with pytest.raises(MissingMandatoryValue) as info:
        OmegaConf.to_object(cfg)
    assert "data_plane.simple.num_storage_units" in str(info.value)
    with pytest.raises(ValueError, match=r"data_plane\.simple\.num_storage_units"):
        coerce_data_plane_config(cfg.data_plane)


@pytest.mark.parametrize(
    "override, key",
    [
        ("data_plane.timeouts.controller_s=0", "data_plane.timeouts.controller_s"),
        ("data_plane.simple.storage_capacity=0", "data_plane.simple.storage_capacity"),
        ("data_plane.claim_meta_poll_interval_s=0", "data_plane.claim_meta_poll_interval_s"),
        ("data_plane.impl=local", "data_plane.impl"),
    ],
)
def test_out_of_range_values_name_the_key(conf_dir: Path, override: str, key: str) -> None:
    cfg = _compose(conf_dir, ["data_plane=tq", override])
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        OmegaConf.to_object(cfg)
