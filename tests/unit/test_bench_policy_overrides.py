"""The step benches train the policy the bench command line names (``policy=hf ...``).

What is isolated: :func:`nemo_dp.bench.steps.launcher_policy_overrides` reads the overrides of
the running Hydra job (set here from a real compose with ``return_hydra_config``, no launcher
process) and keeps exactly the ``policy`` choice and ``policy.*`` keys, in order; a training
config composed with them is the ``hf`` policy with those keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from nemo_dp.bench.steps import launcher_policy_overrides
from nemo_dp.config import register_configs

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hydra_job() -> Iterator[None]:
    register_configs(REPO_ROOT / "recipes")
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base=None):
        yield
    HydraConfig.instance().cfg = None  # type: ignore[assignment]


def _as_job(overrides: list[str]) -> None:
    HydraConfig.instance().set_config(compose("config", overrides=overrides, return_hydra_config=True))


def test_policy_choice_and_keys_are_forwarded_in_order(hydra_job: None) -> None:
    _as_job(["seed=3", "policy=hf", "algorithm.max_steps=2", "policy.dp_size=1", "+policy.extra_key=1"])
    assert launcher_policy_overrides() == ["policy=hf", "policy.dp_size=1", "+policy.extra_key=1"]


def test_nothing_is_forwarded_without_policy_overrides(hydra_job: None) -> None:
    _as_job(["seed=3", "data_plane=tq", "cluster.policy_resources={}"])
    assert launcher_policy_overrides() == []


def test_forwarded_overrides_select_the_policy_of_the_training_config(hydra_job: None) -> None:
    _as_job(["policy=hf", "policy.dp_size=1"])
    train = compose("config", overrides=[*launcher_policy_overrides(), "algorithm=grpo", "policy.train_global_batch_size=16"])
    assert train.policy.kind == "hf" and train.policy.dp_size == 1 and train.policy.train_global_batch_size == 16


def test_outside_a_hydra_job_nothing_is_forwarded() -> None:
    HydraConfig.instance().cfg = None  # type: ignore[assignment]
    assert launcher_policy_overrides() == []


def test_env_choice_and_keys_are_forwarded_with_the_policy(hydra_job: None) -> None:
    _as_job(["policy=hf_vlm", "env=visual", "seed=3", "env.visual_kind=count"])
    assert launcher_policy_overrides() == ["policy=hf_vlm", "env=visual", "env.visual_kind=count"]
    train = compose("config", overrides=[*launcher_policy_overrides(), "~recipe", "algorithm=grpo"])
    assert train.policy.kind == "hf_vlm" and train.env.name == "visual" and train.env.visual_kind == "count"
