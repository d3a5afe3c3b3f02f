"""Rollout actors against real Ray + TransferQueue: rows, versions, claims and failures.

One ``TQPolicy`` (1 DP worker, a tiny model) for the module, built the way the launcher builds
it; the session's bootstrapping client is closed first (one open TransferQueue client per
process).  A ``RolloutGroup`` of two actors generates into the store; the tests check that

* a rollout actor's rows are bit-identical to what the training worker generates with the same
  weights and seeds (tokens, behaviour log-probs) and carry the GRPO advantages of their group;
* every row is stamped with the policy version of the weights it was generated with;
* the trainer's claim returns the batch in the synchronous row order, with tags, and the finished
  batch's partition is gone;
* a failing shard surfaces as its own error at the next claim, not as a claim timeout.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import ray
import torch

from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std
from nemo_dp.algorithms.async_advantages import GroupAdvantages
from nemo_dp.algorithms.trainer_common import sample_seeds
from nemo_dp.data.arithmetic import ArithmeticTask
from nemo_dp.data_plane.factory import make_policy_factory
from nemo_dp.data_plane.interfaces import DataPlaneConfig, SimpleStorageConfig
from nemo_dp.distributed.worker_group import RayCluster
from nemo_dp.environments.arithmetic_env import ArithmeticEnv
from nemo_dp.models.builders import build_tokenizer
from nemo_dp.models.policy.rollout_group import RolloutGroup
from nemo_dp.models.policy.rollout_worker import POLICY_VERSION, TAG_ORDINAL, partition_for_batch

G = 4
PROMPTS = 4


def _config() -> Any:
    from tests.compose import compose_run

    overrides = [
        "~recipe", "seed=3", "data_plane=tq", "env.digits=1", "policy.dp_size=1",
        "policy.model.n_layers=1", "policy.model.d_model=32", "policy.model.n_heads=2",
        "policy.model.max_seq_len=16", "policy.generation.max_new_tokens=4",
        f"algorithm.num_generations_per_prompt={G}", f"algorithm.num_prompts_per_step={PROMPTS}",
        "algorithm.async_rollout.enabled=true",
    ]
    return compose_run(overrides)


TOK = build_tokenizer(_config().policy)


def _group(policy: Any, env: Any, num_workers: int) -> RolloutGroup:
    """A rollout group with the trainer's advantage estimator for ``_config()``."""
    cfg = _config()
    return RolloutGroup(policy, cfg, tokenizer=TOK, env=env, advantage_fn=GroupAdvantages.from_algorithm(cfg.algorithm),
                        num_workers=num_workers, torch_threads=1)


class FailingEnv:
    """Scores nothing: raises, to show a failed shard surfaces at the claim."""

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        raise RuntimeError("scoring exploded")


@pytest.fixture(scope="module")
def policy(ray_cluster: dict[str, str], tq_session: Any) -> Iterator[Any]:
    tq_session.close()
    cfg = _config()
    factory = make_policy_factory(DataPlaneConfig(simple=SimpleStorageConfig(num_storage_units=1)))
    assert factory is not None
    p = factory(cluster=RayCluster(env_vars=dict(ray_cluster)), config=cfg.policy, vocab_size=TOK.vocab_size,
                pad_id=TOK.pad_id, eos_id=TOK.eos_id, seed=3)
    try:
        yield p
    finally:
        p.shutdown()


@pytest.fixture(scope="module")
def rollout(policy: Any) -> Iterator[RolloutGroup]:
    group = _group(policy, ArithmeticEnv(), 2)
    try:
        yield group
    finally:
        group.shutdown()


def _problems() -> list[Any]:
    return ArithmeticTask(1, ("+",), 0).train_problems(PROMPTS)


@pytest.mark.timeout(300)
def test_actor_rows_equal_the_training_workers_generation(policy: Any, rollout: RolloutGroup) -> None:
    problems = _problems()
    seeds = sample_seeds(3, 1, 0, PROMPTS * G)
    rollout.sync_weights(7)
    rollout.dispatch(1, problems, seeds)
    meta = rollout.claim_batch(1, PROMPTS * G, poll_s=0.02, timeout_s=120)
    assert [t[TAG_ORDINAL] for t in meta.tags] == list(range(PROMPTS * G))
    assert meta.sample_ids[:2] == ["a1_p0_g0", "a1_p0_g1"]
    assert {t[POLICY_VERSION] for t in meta.tags} == {7}
    got = policy.read_from_dataplane(
        meta, select_fields=["input_ids", "generation_logprobs", "advantages", POLICY_VERSION]
    )
    prompts = [TOK.encode_prompt(p.prompt) for p in problems for _ in range(G)]
    ref = policy.generate(prompts, seeds, greedy=False)
    width = ref["input_ids"].shape[1]
    assert torch.equal(got["input_ids"][:, :width], ref["input_ids"])
    assert torch.equal(got["generation_logprobs"][:, :width], ref["generation_logprobs"])
    assert torch.equal(got[POLICY_VERSION], torch.full((PROMPTS * G,), 7, dtype=torch.int64))
    # Advantages: the group-relative ones of the rewards the actor computed, on response tokens.
    rewards = torch.tensor([t["reward"] for t in meta.tags], dtype=torch.float32)
    baseline, std = grpo_baseline_and_std(rewards, G, True)
    adv = grpo_advantages(rewards, baseline, std, True)
    tm = ref["token_mask"].float()
    assert torch.equal(got["advantages"][:, :width], adv.unsqueeze(1) * tm)
    rollout.finish_batch(1)
    assert policy.dp_client.list_sample_ids(partition_for_batch(1)) == []
    assert rollout.in_flight_batches() == []


@pytest.mark.timeout(300)
def test_weights_sent_before_a_dispatch_generate_it(policy: Any, rollout: RolloutGroup) -> None:
    problems = _problems()
    rollout.sync_weights(1)
    rollout.dispatch(2, problems, sample_seeds(3, 2, 0, PROMPTS * G))
    rollout.sync_weights(2)
    rollout.dispatch(3, problems, sample_seeds(3, 3, 0, PROMPTS * G))
    assert rollout.in_flight_batches() == [2, 3]
    for batch, version in ((2, 1), (3, 2)):
        meta = rollout.claim_batch(batch, PROMPTS * G, poll_s=0.02, timeout_s=120)
        assert {t[POLICY_VERSION] for t in meta.tags} == {version}
        rollout.finish_batch(batch)
    assert rollout.stats.generated >= 3 * PROMPTS * G


@pytest.mark.timeout(300)
def test_a_failed_shard_surfaces_at_the_claim(policy: Any) -> None:
    group = _group(policy, FailingEnv(), 1)
    try:
        group.sync_weights(0)
        group.dispatch(9, _problems(), sample_seeds(3, 9, 0, PROMPTS * G))
        with pytest.raises(ray.exceptions.RayTaskError, match="scoring exploded"):
            group.claim_batch(9, PROMPTS * G, poll_s=0.02, timeout_s=120)
    finally:
        group.shutdown()
    assert policy.dp_client.list_sample_ids(partition_for_batch(9)) == []
