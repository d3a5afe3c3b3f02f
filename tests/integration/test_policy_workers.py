"""Policy worker group on the shared session Ray cluster (``ray_cluster`` from conftest).

What is checked: replicas stay identical under gloo all-reduce; the update does not depend on
``dp_size``, the microbatch size or the dynamic-batching / sequence-packing plan (global loss
normalisation); log-probs come back in input order under every planner mode; per-sample seeds
make generation independent of batch composition; the reference copy is frozen until
snapshotted; state save/load reproduces a step exactly; the split train API guards its order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from nemo_dp.algorithms.loss_functions import NLLLoss
from nemo_dp.config.schema import ModelSchema, PolicyConfig
from nemo_dp.data.arithmetic import ArithmeticTask
from nemo_dp.data.datasets import SFTDataset, collate_sft
from nemo_dp.distributed.worker_group import RayCluster
from nemo_dp.models.builders import build_tokenizer
from nemo_dp.models.policy import Policy

pytestmark = pytest.mark.timeout(240)

TOK = build_tokenizer({"kind": "tiny"})


def _policy(env: dict[str, str], dp_size: int, **overrides: Any) -> Policy:
    cfg = PolicyConfig(
        dp_size=dp_size,
        model=ModelSchema(n_layers=1, d_model=32, n_heads=2, max_seq_len=24),
        train_global_batch_size=16,
        train_micro_batch_size=8,
        logprob_batch_size=8,
        **overrides,
    )
    return Policy(
        cluster=RayCluster(env_vars=env),
        config=cfg,
        vocab_size=TOK.vocab_size,
        pad_id=TOK.pad_id,
        eos_id=TOK.eos_id,
        seed=7,
    )


def _sft_batch(n: int, seed: int = 0) -> Any:
    ds = SFTDataset.from_arithmetic(ArithmeticTask(2, ("+",), seed), n)
    return collate_sft([ds[i] for i in range(n)], TOK)


@pytest.fixture(scope="module")
def policy2(ray_cluster: dict[str, str]) -> Iterator[Policy]:
    p = _policy(ray_cluster, 2)
    try:
        yield p
    finally:
        p.shutdown()


def test_train_keeps_replicas_identical_and_counts_optimizer_steps(policy2: Policy) -> None:
    batch = _sft_batch(32)
    m = policy2.train(batch, NLLLoss(), gbs=16)
    assert m["num_optimizer_steps"] == 2
    assert len(m["per_step_loss"]) == 2 and m["grad_norm"] > 0
    sums = policy2.weights_checksums()
    assert sums[0] == sums[1]


def _train_fresh(env: dict[str, str], dp_size: int, batch: Any, mbs: int) -> tuple[float, float]:
    """One ``gbs=16`` step of a new ``dp_size`` policy on ``batch``: its loss and rank 0's weight checksum."""
    p = _policy(env, dp_size)
    try:
        return p.train(batch, NLLLoss(), gbs=16, mbs=mbs)["loss"], p.weights_checksums()[0]
    finally:
        p.shutdown()


def test_update_is_independent_of_dp_size_and_microbatching(ray_cluster: dict[str, str]) -> None:
    batch = _sft_batch(16, seed=3)
    loss1, sum1 = _train_fresh(ray_cluster, 1, batch, mbs=16)
    loss2, sum2 = _train_fresh(ray_cluster, 2, batch, mbs=2)
    assert loss1 == pytest.approx(loss2, rel=1e-5)
    assert sum1 == pytest.approx(sum2, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("mode", ["dynamic_batching", "sequence_packing"])
def test_planned_microbatches_preserve_order_and_loss(policy2: Policy, mode: str) -> None:
    # Rows of different lengths so the planner really reorders them.
    ds = SFTDataset([("1+2=", "3"), ("12+34=", "46"), ("5+5=", "10"), ("99+99=", "198")] * 4)
    batch = collate_sft([ds[i] for i in range(len(ds))], TOK)
    plain_lp = policy2.get_logprobs(batch)["logprobs"]
    plain_loss = policy2.train(batch, NLLLoss(), eval_mode=True, gbs=16)["loss"]
    node = policy2.cfg[mode]
    node.enabled = True
    node.train_mb_tokens = 40
    node.logprob_mb_tokens = 40
    try:
        shards, order = policy2._shard_for_dp(batch, batch_size=16, mb_tokens_key="train_mb_tokens")
        assert sorted(order) == list(range(16)) and order != list(range(16))
        assert all(s.micro_batch_indices is not None for s in shards)
        planned_lp = policy2.get_logprobs(batch)["logprobs"]
        planned_loss = policy2.train(batch, NLLLoss(), eval_mode=True, gbs=16)["loss"]
    finally:
        node.enabled = False
    torch.testing.assert_close(planned_lp, plain_lp, rtol=1e-5, atol=1e-5)
    assert planned_loss == pytest.approx(plain_loss, rel=1e-5)


def test_generation_depends_only_on_each_rows_seed(policy2: Policy) -> None:
    prompts = [TOK.encode_prompt(p) for p in ("1+2=", "33+44=", "7+8=", "50+50=", "9+9=")]
    seeds = [11, 12, 13, 14, 15]
    full = policy2.generate(prompts, seeds, greedy=False)
    single = policy2.generate([prompts[2]], [seeds[2]], greedy=False)
    n = int(single["input_lengths"][0])
    assert int(full["input_lengths"][2]) == n
    assert torch.equal(full["input_ids"][2, :n], single["input_ids"][0, :n])
    assert full["input_ids"].shape[0] == 5 and full["token_mask"].dtype == torch.int32
    greedy_a = policy2.generate(prompts, seeds, greedy=True)
    greedy_b = policy2.generate(prompts, [0] * 5, greedy=True)
    assert torch.equal(greedy_a["input_ids"], greedy_b["input_ids"])


def test_reference_policy_is_frozen_until_snapshot(policy2: Policy) -> None:
    batch = _sft_batch(16, seed=5)
    policy2.snapshot_reference_policy()
    ref_before = policy2.get_reference_policy_logprobs(batch)["reference_logprobs"]
    torch.testing.assert_close(ref_before, policy2.get_logprobs(batch)["logprobs"])
    policy2.train(batch, NLLLoss(), gbs=16)
    ref_after = policy2.get_reference_policy_logprobs(batch)["reference_logprobs"]
    current = policy2.get_logprobs(batch)["logprobs"]
    assert torch.equal(ref_before, ref_after)
    assert not torch.allclose(current, ref_after)
    policy2.snapshot_reference_policy()
    torch.testing.assert_close(policy2.get_reference_policy_logprobs(batch)["reference_logprobs"], current)


def test_state_roundtrip_reproduces_a_step_exactly(policy2: Policy) -> None:
    batch = _sft_batch(16, seed=9)
    state = policy2.state_dict()
    assert len(state["worker_rng"]) == 2
    first = policy2.train(batch, NLLLoss(), gbs=16)
    sums_first = policy2.weights_checksums()
    policy2.load_state_dict(state)
    second = policy2.train(batch, NLLLoss(), gbs=16)
    assert first["loss"] == second["loss"] and first["grad_norm"] == second["grad_norm"]
    assert policy2.weights_checksums() == sums_first
    with pytest.raises(ValueError, match="dp_size"):
        policy2.load_state_dict({"weights": state["weights"], "worker_rng": state["worker_rng"][:1]})


def test_split_train_api_guards_its_order(policy2: Policy) -> None:
    import ray

    group = policy2.worker_group
    with pytest.raises(ray.exceptions.RayTaskError, match="without begin_train_step"):
        group.run_rank(0, "train_microbatch", _sft_batch(8))
    group.run_rank(0, "begin_train_step", NLLLoss())
    try:
        with pytest.raises(ray.exceptions.RayTaskError, match="already active"):
            group.run_rank(0, "begin_train_step", NLLLoss())
    finally:
        group.run_rank(0, "abort_train_step")
    group.run_rank(0, "abort_train_step")  # idempotent


def test_bad_batch_shapes_fail_on_the_driver(policy2: Policy) -> None:
    with pytest.raises(ValueError, match="dp_size"):
        policy2.train(_sft_batch(15), NLLLoss(), gbs=15)
    with pytest.raises(ValueError, match="seeds"):
        policy2.generate([TOK.encode_prompt("1+1=")], [1, 2], greedy=True)


def _grpo_cfg(**algo: Any) -> Any:
    from omegaconf import OmegaConf

    from nemo_dp.config.schema import EnvConfig, GRPOConfig

    return OmegaConf.create(
        {
            "seed": 3,
            "algorithm": OmegaConf.structured(GRPOConfig(**algo)),
            "env": OmegaConf.structured(EnvConfig()),
        }
    )


def test_grpo_rollout_batch_and_dynamic_sampling_budget(policy2: Policy) -> None:
    from nemo_dp.algorithms.grpo import LegacyGRPOPath
    from nemo_dp.algorithms.grpo_step import collect_grpo_rows
    from nemo_dp.config.schema import DynamicSamplingConfig
    from nemo_dp.data.datasets import EpochLoader, RLPromptDataset
    from nemo_dp.environments.arithmetic_env import ArithmeticEnv

    problems = RLPromptDataset.from_arithmetic(ArithmeticTask(2, ("+",), 0), 32)
    cfg = _grpo_cfg(num_prompts_per_step=4, num_generations_per_prompt=4, num_train_prompts=32)
    loader = EpochLoader(problems, batch_size=4, seed=0)
    path = LegacyGRPOPath(policy2, TOK, ArithmeticEnv())
    rows, info = collect_grpo_rows(path, cfg, train_loader=loader, step=1)
    batch = rows.handle
    assert batch.size == 16 and info["num_gen_batches"] == 1
    assert batch["std"].shape == (16,) and batch["rewards"].dtype == torch.float32
    # Same step, same seeds: the rollout is reproducible.
    loader2 = EpochLoader(problems, batch_size=4, seed=0)
    again = collect_grpo_rows(path, cfg, train_loader=loader2, step=1)[0].handle
    assert torch.equal(batch["input_ids"], again["input_ids"])
    # An untrained policy never solves a problem: every group has zero reward std, so dynamic
    # sampling can never fill the batch and must stop at its budget.
    assert float(batch["rewards"].sum()) == 0.0
    ds_cfg = _grpo_cfg(
        num_prompts_per_step=4,
        num_generations_per_prompt=4,
        num_train_prompts=32,
        dynamic_sampling=DynamicSamplingConfig(enabled=True, max_gen_batches=2),
    )
    with pytest.raises(ValueError, match=r"Dynamic sampling reached max_gen_batches=2"):
        collect_grpo_rows(path, ds_cfg, train_loader=loader, step=2)
