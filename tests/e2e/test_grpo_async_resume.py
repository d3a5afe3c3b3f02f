"""RESUME: an asynchronous GRPO run killed between checkpoints loses and repeats no prompt.

The failure this guards against: an asynchronous trainer's loader has always run ahead of
training (rollout batches are generated while earlier ones train), so a checkpoint that saves
the live loader cursor silently skips the generated-but-untrained batches on resume.

The run (``max_staleness=1``, 6 steps = exactly one epoch of 24 prompts, checkpoints every 2
steps) crashes right after step 3 is logged, i.e. between the checkpoints of steps 2 and 4,
with rollout batches in flight.  The crash is an exception raised from the phase's logger (a
test double of the run's ``RunLogger``, the only thing it isolates); the trainer's ``finally``
and the driver then tear everything down, including the TransferQueue system, so the in-flight
samples are gone exactly as in a killed process.  A fresh policy and TransferQueue system then
resume from the latest checkpoint.  Over both runs the ledger must show every prompt of the
epoch trained exactly once, in the loader's order, and each step logged once.

Runs in a subprocess (this file as a script) with its own Ray.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CRASH_AFTER_STEP = 3

OVERRIDES: tuple[str, ...] = (
    "~recipe",
    "seed=5",
    "data_plane=tq",
    "env.digits=1",
    "policy.dp_size=1",
    "policy.model.n_layers=1",
    "policy.model.d_model=32",
    "policy.model.n_heads=2",
    "policy.model.max_seq_len=16",
    "policy.generation.max_new_tokens=4",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=8",
    "policy.logprob_batch_size=8",
    "algorithm.max_steps=6",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=2",
    "algorithm.num_train_prompts=24",
    "algorithm.val_samples=4",
    "algorithm.val_period=0",
    "algorithm.val_at_start=false",
    "algorithm.warm_start.enabled=false",
    "algorithm.async_rollout.enabled=true",
    "algorithm.async_rollout.max_staleness=1",
    "algorithm.async_rollout.num_rollout_workers=1",
    "checkpointing.enabled=true",
    "checkpointing.save_period=2",
    "checkpointing.keep_last=5",
    "logger.plot=false",
    "logger.progress_bar=false",
)


class SimulatedCrash(RuntimeError):
    """Raised by the test logger to interrupt the run between checkpoints."""


def run_crash_and_resume(out_dir: Path) -> dict[str, Any]:
    """Crash a run after step ``CRASH_AFTER_STEP``, resume it from its checkpoint, report.

    Args:
        out_dir: Run directory (metrics, ledger, checkpoints).

    Returns:
        The ledgers, metrics and checkpoint facts the test checks.
    """
    from hydra import compose, initialize_config_dir

    from nemo_dp.algorithms.async_ledger import read_ledger
    from nemo_dp.config import register_configs, validate_config
    from nemo_dp.data_plane.factory import select_sync_trainer
    from nemo_dp.distributed.ray_init import shutdown_ray
    from tests.e2e.ray_cluster import init_script_ray
    from nemo_dp.training import (
        Checkpointer,
        RunLogger,
        build_inputs,
        load_start_state,
        main_phase,
        make_policy,
        make_tokenizer,
        run_phase,
    )
    from nemo_dp.utils.metrics import read_metrics

    class CrashingLogger(RunLogger):
        def log_step(self, step: int, metrics: Any) -> dict[str, Any]:
            record = super().log_step(step, metrics)
            if step == CRASH_AFTER_STEP:
                raise SimulatedCrash(f"simulated crash after step {step}")
            return record

    register_configs(REPO_ROOT / "recipes")
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=list(OVERRIDES))
    validate_config(cfg)
    tok = make_tokenizer(cfg)
    trainer = select_sync_trainer(cfg)
    phase = main_phase(cfg)
    ckpt_root = out_dir / "ckpt"
    env = init_script_ray(cfg.data_plane)
    report: dict[str, Any] = {"trainer": f"{trainer.__module__}:{trainer.__name__}"}
    try:

        def run(logger_cls: type, start_state: Any) -> None:
            policy = make_policy(cfg, tok, env_vars=env)
            try:
                run_phase(
                    phase,
                    policy,
                    tokenizer=tok,
                    logger=logger_cls(out_dir, metrics_file="metrics.jsonl", plot_file="p.png", plot=False,
                                      progress_bar=False, label="GRPO"),
                    checkpointer=Checkpointer(ckpt_root, enabled=True, save_period=2, keep_last=5),
                    start_state=start_state,
                    trainer=trainer,
                )
            finally:
                policy.shutdown()  # closes the TransferQueue system: in-flight samples are gone

        try:
            run(CrashingLogger, None)
        except SimulatedCrash as exc:
            report["crash"] = str(exc)
        report["ledger_before_resume"] = read_ledger(out_dir / "async_ledger.jsonl")
        state = load_start_state(ckpt_root)
        assert state is not None
        report["checkpoint"] = {
            "path": state["checkpoint_path"],
            "step": state["counters"]["step"],
            "async": state["async_rollout"],
            "loader": state["loader"],
        }
        run(RunLogger, state)
        report["ledger"] = read_ledger(out_dir / "async_ledger.jsonl")
        report["records"] = read_metrics(out_dir / "metrics.jsonl")
        # The uninterrupted loader order, as ground truth for the prompts of each step.
        loader = build_inputs(cfg, tok).train_loader
        order = []
        for _ in range(int(cfg.algorithm.max_steps)):
            loader.next_batch()
            order.append(list(loader.last_batch_indices))
        report["loader_order"] = order
    finally:
        shutdown_ray()
    return report


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("grpo_async_resume")
    from tests.e2e.conftest import run_json_script

    return run_json_script(Path(__file__).resolve(), [str(out)], out / "resume.json", timeout=400)


@pytest.mark.timeout(450)
def test_every_prompt_of_the_epoch_is_trained_exactly_once(resumed: dict[str, Any]) -> None:
    assert resumed["trainer"] == "nemo_dp.algorithms.grpo_async:grpo_train_async"
    assert resumed["crash"] == f"simulated crash after step {CRASH_AFTER_STEP}"
    # The interrupted run trained steps 1-3; its last checkpoint is step 2, taken while
    # batches 3 and 4 were already dispatched (generated or generating) but not trained.
    assert [r["step"] for r in resumed["ledger_before_resume"]] == [1, 2, 3]
    ckpt = resumed["checkpoint"]
    assert ckpt["step"] == 2
    assert ckpt["async"]["in_flight_batches"] == [3, 4]
    # The saved loader position is before batch 3, not the live cursor (after batch 4).
    assert ckpt["loader"]["cursor"] == 2 * 4 and ckpt["loader"]["epoch"] == 0
    ledger = resumed["ledger"]
    assert [r["step"] for r in ledger] == [1, 2, 3, 4, 5, 6]
    assert [r["indices"] for r in ledger] == resumed["loader_order"]
    assert all(r["epoch"] == 0 for r in ledger)
    trained = sorted(i for r in ledger for i in r["indices"])
    assert trained == list(range(24)), "a prompt was skipped or trained twice"
    ids = [s for r in ledger for s in r["sample_ids"]]
    assert len(ids) == len(set(ids)) == 48
    # The resumed run regenerated batch 3 with the checkpoint's weights (version 2).
    assert ledger[2]["generated_with_version"] == 2
    steps = [int(r["step"]) for r in resumed["records"]]
    assert steps == [1, 2, 3, 4, 5, 6]


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO_ROOT))
    res = run_crash_and_resume(target)
    (target / "resume.json").write_text(json.dumps(res, indent=1, default=str))
