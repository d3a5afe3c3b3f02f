"""Store round trips per training step on the real TransferQueue adapter, counted per op kind.

One ``TQPolicy`` (2 DP workers, a tiny model, observability on) for the module, built the way
the launcher builds it.  A two-step ``grpo_train_sync`` and a two-step ``ppo_train_sync`` run on
it; the first step's logged store counters (step 2 also runs the held-out evaluation, whose
traffic lands in its window) must be exactly the budget of one step:

* per worker: one read per stage that needs inputs and one write per stage that produces
  outputs - GRPO: rollout put, one log-prob read + one put of both log-prob columns, one
  training read; PPO adds one read per epoch and the critic's values read/put;
* on the driver: one registration and one clear of the whole step; GRPO's per-row advantages
  and sample mask travel with the training dispatch, PPO adds one read of the columns its
  advantage needs and one put of everything it computes.

Counts, never timings.  The counts are those of the slowest rank (``max_rank``): every rank runs
the same stages, so any rank above the budget shows up there as well.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_dp.algorithms.context import TrainContext
from nemo_dp.algorithms.grpo_sync import grpo_train_sync
from nemo_dp.algorithms.ppo_sync import ppo_train_sync
from nemo_dp.data.arithmetic import ArithmeticTask
from nemo_dp.data.datasets import EpochLoader, RLPromptDataset
from nemo_dp.environments.arithmetic_env import ArithmeticEnv
from nemo_dp.models.tiny.tokenizer import CharTokenizer
from nemo_dp.training import Checkpointer, RunLogger
from nemo_dp.utils.metrics import read_metrics

from .conftest import compose_tiny_tq_rl, observed_tq_policy

pytestmark = pytest.mark.timeout(300)

TOK = CharTokenizer()
G = 2
PROMPTS = 2
ROWS = PROMPTS * G  # rows per step; 2 per DP rank
PPO_EPOCHS = 2


def _master_config(algorithm: str, **algo: Any) -> Any:
    return compose_tiny_tq_rl(
        f"algorithm={algorithm}",
        "data_plane.observability.enabled=true",
        f"policy.train_global_batch_size={ROWS}",
        "policy.train_micro_batch_size=1",  # several micro-batches per rank: still one read
        "policy.logprob_batch_size=1",
        f"algorithm.num_prompts_per_step={PROMPTS}",
        f"algorithm.num_generations_per_prompt={G}",
        "algorithm.max_steps=2",
        "algorithm.val_period=0",
        *[f"algorithm.{k}={v}" for k, v in algo.items()],
    )


@pytest.fixture(scope="module")
def policy(ray_cluster: dict[str, str], tq_session: Any) -> Iterator[Any]:
    with observed_tq_policy(ray_cluster, tq_session, _master_config("grpo").policy) as p:
        yield p


def _first_step_record(trainer: Any, policy: Any, cfg: Any, tmp_path: Path) -> dict[str, Any]:
    problems = ArithmeticTask(1, ("+",), 0).train_problems(8)
    logger = RunLogger(tmp_path, metrics_file="metrics.jsonl", plot_file="p.png", plot=False,
                       progress_bar=False, label="round_trips")
    result = trainer(
        TrainContext(
            policy=policy,
            cfg=cfg,
            train_loader=EpochLoader(RLPromptDataset(problems), batch_size=PROMPTS, seed=0, shuffle=False),
            val_problems=problems[:4],
            tokenizer=TOK,
            env=ArithmeticEnv(),
            logger=logger,
            checkpointer=Checkpointer(tmp_path / "ckpt", enabled=False, save_period=0, keep_last=1),
        )
    )
    assert result["step"] == 2
    assert policy.dp_client.list_sample_ids("train") == []
    (record,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 1]
    return record


def _calls(record: dict[str, Any], prefix: str) -> dict[str, int]:
    """``{op: calls}`` of one site's per-op keys (``{prefix}/{op}/calls``)."""
    head = prefix + "/"
    out = {}
    for key, value in record.items():
        parts = key[len(head):].split("/") if key.startswith(head) else []
        if len(parts) == 2 and parts[1] == "calls":
            out[parts[0]] = int(value)
    return out


def test_grpo_step_store_calls_per_op(policy: Any, tmp_path: Path) -> None:
    record = _first_step_record(grpo_train_sync, policy, _master_config("grpo"), tmp_path)
    # Driver: register the step and clear it; the per-row advantages and sample mask travel
    # with the training dispatch, so the driver neither writes nor reads a column.
    assert _calls(record, "data_plane/step") == {"register": 1, "clear": 1}
    assert record["data_plane/step/bytes_written_mb"] == 0.0
    assert record["data_plane/step/bytes_read_mb"] == 0.0
    # Worker: rollout put, log-prob stage (one read, one put of both columns), training read -
    # with two micro-batches per rank in both the log-prob and the training stage.
    worker = _calls(record, "data_plane/workers/max_rank")
    assert worker == {"put": 2, "get_data": 2}
    assert record["data_plane/workers/max_rank/put/rows"] == 2 * (ROWS // 2)
    assert record["data_plane/workers/max_rank/get_data/rows"] == 2 * (ROWS // 2)


def test_ppo_step_store_calls_per_op(policy: Any, tmp_path: Path) -> None:
    cfg = _master_config("ppo", ppo_epochs=PPO_EPOCHS)
    record = _first_step_record(ppo_train_sync, policy, cfg, tmp_path)
    # Driver: register, one read of the advantage's inputs, one put of advantages + returns +
    # sample_mask, one clear.
    assert _calls(record, "data_plane/step") == {"register": 1, "get_data": 1, "put": 1, "clear": 1}
    # Policy worker: rollout put, log-prob stage read + put, one training read per epoch.
    assert _calls(record, "data_plane/workers/max_rank") == {"put": 2, "get_data": 1 + PPO_EPOCHS}
    # Critic worker: values read + put, one training read per epoch.
    assert _calls(record, "data_plane/critic_workers/max_rank") == {"put": 1, "get_data": 1 + PPO_EPOCHS}


def test_train_row_values_are_checked_before_any_dispatch(policy: Any) -> None:
    import torch

    from nemo_dp.data_plane.interfaces import KVBatchMeta

    meta = KVBatchMeta("train", None, ["a", "b"], sequence_lengths=[3, 4])
    with pytest.raises(ValueError, match="not one of"):
        policy.train_from_meta(meta, None, row_values={"returns": torch.ones(2)})
    with pytest.raises(ValueError, match="1-D tensor of meta.size=2"):
        policy.train_from_meta(meta, None, row_values={"advantages": torch.ones(2, 1)})
    with pytest.raises(ValueError, match="train_fields must include"):
        policy.train_from_meta(
            meta, None, row_values={"advantages": torch.ones(2)}, train_fields=["input_ids"]
        )
