"""Configuration tests: every group option and recipe composes and validates; bad overrides
fail at compose/validate time naming the key (and the legal values where there is a list)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from nemo_dp.config import (
    CONF_DIR,
    RECIPES_DIR,
    PreflightError,
    preflight,
    register_configs,
    validate_config,
    warm_start_config,
)
from nemo_dp.config.schema import GRPOConfig, MasterConfig, SFTConfig

GROUPS = ("algorithm", "data_plane", "policy", "env", "cluster", "logger", "checkpointing")
DEFAULT_RECIPE = "arith_main"

register_configs()


def _compose(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return compose("config", overrides=overrides)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def _leaves(node: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_leaves(v, key + "."))
        else:
            out[key] = v
    return out


@pytest.mark.parametrize(
    ("group", "option"), [(g, o) for g in GROUPS for o in _options(g)], ids=lambda x: str(x)
)
def test_every_group_option_composes_and_validates(group: str, option: str) -> None:
    overrides = ["~recipe", f"{group}={option}"]
    if group == "data_plane" and option == "local":
        overrides.append("algorithm=sft")  # the local store serves SFT only
    cfg = _compose(overrides)
    obj = validate_config(cfg)
    assert isinstance(obj, MasterConfig)
    assert OmegaConf.select(cfg, group) is not None


def test_group_options_exist() -> None:
    assert set(_options("algorithm")) >= {"sft", "grpo"}
    assert set(_options("data_plane")) >= {"disabled", "local", "tq"}
    for group in GROUPS:
        assert _options(group), f"conf/{group}/ has no options"


@pytest.mark.parametrize("recipe", _recipes())
def test_every_recipe_composes_validates_and_names_its_command(recipe: str) -> None:
    text = (RECIPES_DIR / f"{recipe}.yaml").read_text()
    first = text.splitlines()[0]
    assert first.startswith("# python launchers/launch.py"), first
    if recipe != DEFAULT_RECIPE:
        assert f"recipe={recipe}" in first
    else:
        assert first.strip() == "# python launchers/launch.py"
    assert re.search(r"override /algorithm: (sft|grpo|ppo)", text)
    cfg = _compose([f"recipe={recipe}"])
    validate_config(cfg)


@pytest.mark.parametrize("recipe", _recipes())
def test_recipes_set_only_deltas(recipe: str) -> None:
    raw = OmegaConf.to_container(OmegaConf.load(RECIPES_DIR / f"{recipe}.yaml"))
    assert isinstance(raw, dict)
    algo = re.search(r"override /algorithm: (\w+)", (RECIPES_DIR / f"{recipe}.yaml").read_text())
    assert algo is not None
    base = OmegaConf.to_container(_compose(["~recipe", f"algorithm={algo.group(1)}"]))
    assert isinstance(base, dict)
    base_leaves = _leaves(base)
    for key, value in _leaves({k: v for k, v in raw.items() if k != "defaults"}).items():
        assert key in base_leaves, f"{recipe}: {key} is not a config key"
        assert base_leaves[key] != value, f"{recipe}: {key}={value!r} repeats the default"


def test_default_run_is_the_main_recipe() -> None:
    cfg = _compose([])
    obj = validate_config(cfg)
    assert isinstance(obj.algorithm, GRPOConfig)
    assert obj.algorithm.warm_start.enabled
    # The main job is the project's point: GRPO over TransferQueue (data_plane=disabled is one
    # override away).
    assert cfg.data_plane.enabled is True and cfg.data_plane.impl == "transfer_queue"


def test_recipe_selection_from_another_working_directory(tmp_path: Path) -> None:
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        cfg = _compose(["recipe=sft_arith"])
    finally:
        os.chdir(old)
    assert isinstance(validate_config(cfg).algorithm, SFTConfig)


def test_unknown_key_fails_naming_it() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["policy.not_a_key=1"])
    assert "policy.not_a_key" in str(err.value)


def test_unknown_nested_key_in_algorithm_fails() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["recipe=sft_arith", "algorithm.num_prompts_per_step=4"])
    assert "algorithm.num_prompts_per_step" in str(err.value)


def test_wrong_type_fails_naming_key() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["policy.dp_size=two"])
    text = str(err.value) + str(err.value.__cause__)
    assert "policy.dp_size" in text


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("policy.dp_size=0", "policy.dp_size"),
        ("policy.optimizer.lr=-1", "policy.optimizer.lr"),
        ("policy.model.d_model=130", "policy.model.d_model"),
        ("policy.train_global_batch_size=33", "policy.train_global_batch_size"),
        ("algorithm.max_steps=0", "algorithm.max_steps"),
        ("algorithm.dynamic_sampling.max_gen_batches=0", "algorithm.dynamic_sampling.max_gen_batches"),
        ("algorithm.num_generations_per_prompt=1", "algorithm.num_generations_per_prompt"),
        ("algorithm.warm_start.lr=0", "algorithm.warm_start.lr"),
        ("cluster.num_cpus=0", "cluster.num_cpus"),
        ("env.digits=0", "env.digits"),
        ("policy.model.max_seq_len=8", "policy.model.max_seq_len"),
        ("checkpointing.keep_last=0", "checkpointing.keep_last"),
        ("seed=-1", "seed"),
    ],
)
def test_out_of_range_value_fails_naming_key(override: str, key: str) -> None:
    cfg = _compose([override])
    with pytest.raises(ValueError) as err:
        validate_config(cfg)
    assert str(err.value).startswith(f"{key}:"), str(err.value)


@pytest.mark.parametrize(
    ("override", "key", "legal"),
    [
        ("policy.sequence_packing.algorithm=bogus", "policy.sequence_packing.algorithm", "first_fit_decreasing"),
        ("policy.optimizer.name=sgd", "policy.optimizer.name", "adamw"),
        ("env.operators=[/]", "env.operators", "'+'"),
        ("policy.sequence_packing.microbatch_order=random", "policy.sequence_packing.microbatch_order", "largest_first"),
    ],
)
def test_illegal_value_names_key_and_legal_values(override: str, key: str, legal: str) -> None:
    cfg = _compose([override])
    with pytest.raises(ValueError) as err:
        validate_config(cfg)
    msg = str(err.value)
    assert msg.startswith(f"{key}:") and "legal values" in msg and legal in msg, msg


def test_unknown_group_choice_lists_options() -> None:
    with pytest.raises(ConfigCompositionException) as err:
        _compose(["algorithm=no_such_algo"])
    msg = str(err.value)
    assert "algorithm" in msg and "grpo" in msg and "sft" in msg


def test_illegal_algorithm_data_plane_pair_fails_at_validation() -> None:
    cfg = _compose(["~recipe", "algorithm=grpo", "data_plane=local"])
    with pytest.raises(ValueError) as err:
        validate_config(cfg)
    msg = str(err.value)
    assert "grpo" in msg and "local" in msg and "data_plane=tq" in msg


def test_data_plane_key_errors_name_the_key() -> None:
    cfg = _compose(["~recipe", "algorithm=sft", "data_plane=local", "data_plane.max_partitions=0"])
    with pytest.raises(ValueError, match=r"data_plane\.max_partitions"):
        validate_config(cfg)


def test_warm_start_config_is_an_sft_view() -> None:
    cfg = _compose(["algorithm.warm_start.lr=0.005", "algorithm.warm_start.max_steps=7"])
    ws = warm_start_config(cfg)
    assert ws.algorithm.name == "sft"
    assert ws.algorithm.max_steps == 7
    assert ws.policy.optimizer.lr == 0.005
    assert cfg.policy.optimizer.lr != 0.005  # the GRPO phase keeps its own learning rate
    obj = validate_config(ws)
    assert isinstance(obj.algorithm, SFTConfig)
    with pytest.raises(ValueError, match="warm_start"):
        warm_start_config(_compose(["recipe=sft_arith"]))


def test_preflight_cpu_budget(tmp_path: Path) -> None:
    machine = os.cpu_count() or 1
    obj = validate_config(_compose([f"cluster.num_cpus={machine + 1}"]))
    with pytest.raises(PreflightError, match="cluster.num_cpus"):
        preflight(obj, tmp_path)
    obj = validate_config(_compose(["cluster.num_cpus=1", "policy.dp_size=2"]))
    with pytest.raises(PreflightError, match="policy.dp_size"):
        preflight(obj, tmp_path)


def test_preflight_paths(tmp_path: Path) -> None:
    obj = validate_config(_compose(["cluster.num_cpus=1", "policy.dp_size=1", "data_plane=disabled"]))
    preflight(obj, tmp_path / "run")
    # Probed, not created: a run refused later leaves no directory behind.
    assert list(tmp_path.iterdir()) == []
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PreflightError, match="hydra.run.dir"):
        preflight(obj, blocker / "run")
    obj = validate_config(
        _compose(["cluster.num_cpus=1", "policy.dp_size=1", "data_plane=disabled",
                  f"checkpointing.resume_from={tmp_path}/nope"])
    )
    with pytest.raises(PreflightError, match="checkpointing.resume_from"):
        preflight(obj, tmp_path / "run2")


def test_help_lists_only_usable_group_options() -> None:
    """``launch.py --help`` (Hydra's own help, no run) offers no schema as a group option."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(repo / "launchers" / "launch.py"), "--help"],
        cwd=repo, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = proc.stdout.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    assert "_schema" not in groups, groups
    for line in ("algorithm: grpo, ppo, sft", "data_plane: disabled, local, ray, tq", "policy: hf, hf_vlm, smollm2, tiny"):
        assert line in groups, groups
    assert "bench:" not in groups, groups  # the bench group lives in conf_bench/, for bench.py only


def test_micro_batch_larger_than_the_per_worker_batch_is_refused_naming_the_keys() -> None:
    cfg = _compose(["policy.dp_size=2", "policy.train_global_batch_size=256", "policy.train_micro_batch_size=256"])
    with pytest.raises(ValueError) as err:
        validate_config(cfg)
    msg = str(err.value)
    assert msg.startswith("policy.train_micro_batch_size:"), msg
    assert "policy.train_global_batch_size / policy.dp_size = 256 / 2 = 128" in msg and "got 256" in msg, msg
    # Exactly the per-worker share is fine, and null means that share.
    validate_config(_compose(["policy.train_global_batch_size=256", "policy.train_micro_batch_size=128"]))
    cfg = _compose(["~recipe", "policy.train_global_batch_size=8"])
    assert cfg.policy.train_micro_batch_size is None
    from nemo_dp.config.schema import train_micro_batch_rows

    assert train_micro_batch_rows(validate_config(cfg).policy) == 4


def test_global_batch_that_does_not_divide_over_the_workers_is_refused_naming_both_keys() -> None:
    cfg = _compose(["~recipe", "algorithm=sft", "policy.dp_size=3", "policy.train_global_batch_size=64"])
    with pytest.raises(ValueError) as err:
        validate_config(cfg)
    assert str(err.value) == "policy.train_global_batch_size: must be a multiple of policy.dp_size=3, got 64"


def test_a_key_added_with_plus_is_refused_unless_the_node_is_open() -> None:
    cfg = _compose(["+algorithm.max_stepz=3"])
    with pytest.raises(ValueError) as err:
        validate_config(cfg)
    msg = str(err.value)
    assert msg.startswith("algorithm.max_stepz: not a key of algorithm (did you mean algorithm.max_steps?)"), msg
    assert "'+'" in msg
    with pytest.raises(ValueError, match=r"^policy\.optimizer\.learning_rate: not a key of policy\.optimizer"):
        validate_config(_compose(["+policy.optimizer.learning_rate=0.5"]))
    # cluster.policy_resources is a mapping in the schema: an open node takes new keys.
    obj = validate_config(_compose(["+cluster.policy_resources.node_b=0.5"]))
    assert obj.cluster.policy_resources == {"node_b": 0.5}


def test_composition_hints_name_the_closest_option_and_key_never_plus() -> None:
    from nemo_dp.config.hints import composition_hints
    from nemo_dp.training.recipe_hints import recipe_hint

    hints = composition_hints(["algorithm=gpro"], conf_dir=CONF_DIR)
    assert hints == ["hint: algorithm=gpro is not an option of group 'algorithm'; did you mean algorithm=grpo? "
                     "(options: grpo, ppo, sft)"]
    # The recipe hint ("add ~recipe") is for a real algorithm the default recipe cannot take.
    assert recipe_hint(["algorithm=gpro"], recipes_dir=RECIPES_DIR, default_recipe=DEFAULT_RECIPE) is None
    assert "recipe=ppo_arith" in str(recipe_hint(["algorithm=ppo"], recipes_dir=RECIPES_DIR, default_recipe=DEFAULT_RECIPE))
    (hint,) = composition_hints(["seed=3", "algorithm.max_stepz=3"], conf_dir=CONF_DIR)
    assert hint == ("hint: algorithm.max_stepz is not a configuration key, and +algorithm.max_stepz=3 would be "
                    "refused too (nothing reads it); did you mean algorithm.max_steps=3?")
    assert composition_hints(["algorithm=grpo", "algorithm.max_steps=3"], conf_dir=CONF_DIR) == []


def test_preflight_refuses_a_cpu_budget_the_data_planes_actors_do_not_fit(tmp_path: Path) -> None:
    obj = validate_config(_compose(["cluster.num_cpus=2", "data_plane=tq", "data_plane.simple.num_storage_units=2"]))
    with pytest.raises(ValueError, match=r"^cluster\.num_cpus=2 is too small: the data plane's own actors reserve 3 "
                                         r"logical CPUs .*data_plane\.simple\.num_storage_units=2"):
        preflight(obj, tmp_path / "run")
    preflight(validate_config(_compose(["cluster.num_cpus=2", "data_plane=tq"])), tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


def test_preflight_refuses_cuda_without_a_visible_device_for_a_local_ray(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(PreflightError, match=r"^policy\.device: cuda, but torch .* local\); set policy\.device=cpu"):
        preflight(validate_config(_compose(["policy.device=cuda"])), tmp_path / "run")
    # Joining a cluster: its nodes may have the GPUs, so this machine's view is not the test.
    preflight(validate_config(_compose(["policy.device=cuda", "cluster=auto"])), tmp_path / "run")


def test_output_dir_problem_names_the_key_before_hydra_creates_it(tmp_path: Path) -> None:
    from nemo_dp.training.output_dir import output_dir_key_and_path, output_dir_problem

    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert output_dir_problem([f"hydra.run.dir={blocker}/run"], CONF_DIR) == (
        f"hydra.run.dir: output path '{blocker}/run' is not writable: '{blocker}' is not a directory"
    )
    assert output_dir_problem(["-m", f"hydra.sweep.dir={blocker}/sweep", "seed=1,2"], CONF_DIR).startswith(
        "hydra.sweep.dir: "
    )
    assert output_dir_problem([f"hydra.run.dir={tmp_path}/new/run"], CONF_DIR) is None
    assert output_dir_key_and_path([], CONF_DIR) == ("hydra.run.dir", "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}")
    assert list(tmp_path.iterdir()) == [blocker]
