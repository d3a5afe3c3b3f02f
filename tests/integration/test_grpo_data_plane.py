"""GRPO over the data plane on the real TransferQueue adapter (and no bulk tensor reaching the driver).

One ``TQPolicy`` (2 DP workers, a tiny model) for the module, built the way the launcher builds
it (``make_policy_factory``).  The session's bootstrapping client is closed first (at most one
open TransferQueue client per process; ``TQPolicy`` bootstraps its own) and the next test that
asks ``tq_session`` for a client gets a fresh system.

What is checked:
* K74 - a full data-plane step keeps dtypes, the workers' ``prev_logprobs`` equal the legacy
  ``get_logprobs`` of the same rows, a logging read before ``finish_step`` works and every read
  after it raises ``KeyError``; overwriting a column with another dtype raises ``TypeError``; a
  failing step (``max_gen_batches`` exceeded) still drops ``"train"`` and the next step can
  register again.
* K75 - dynamic sampling on metas: zero-std groups are dropped and cleared, survivors stay
  readable, an incomplete batch continues with another rollout, an overflow 6 -> 4 is sliced
  and its 2 ids cleared, ``num_gen_batches`` is recorded.
* Rule 6 - in a whole ``grpo_train_sync`` step the driver receives no per-token tensor: every
  object Ray returns to the driver is inspected (only metas and 1-D per-row tensors), and the
  driver's own data-plane client read 0 bytes (observability counters in ``metrics.jsonl``).

``ScriptedEnv`` replaces the arithmetic reward in the K75 test only: it isolates the
dynamic-sampling bookkeeping from what the untrained model happens to answer (group rewards
are set by the problem's answer string, so which groups survive is known in advance).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_dp.algorithms.grpo_step import collect_grpo_rows
from nemo_dp.algorithms.grpo_sync import StoreGRPOPath, grpo_train_sync
from nemo_dp.algorithms.loss_functions import ClippedPGLossFn
from nemo_dp.algorithms.context import TrainContext
from nemo_dp.training import Checkpointer, RunLogger
from nemo_dp.data.arithmetic import ArithmeticTask, Problem
from nemo_dp.data.datasets import EpochLoader, RLPromptDataset
from nemo_dp.models.tiny.tokenizer import CharTokenizer
from nemo_dp.data_plane.interfaces import KVBatchMeta
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.environments.arithmetic_env import ArithmeticEnv
from nemo_dp.utils.metrics import read_metrics

from .conftest import compose_tiny_tq_rl, observed_tq_policy

pytestmark = pytest.mark.timeout(240)

TOK = CharTokenizer()
G = 2


def _master_config(**algo: Any) -> Any:
    return compose_tiny_tq_rl(
        "policy.train_global_batch_size=4",
        "policy.train_micro_batch_size=2",
        "policy.logprob_batch_size=4",
        "algorithm.num_prompts_per_step=2",
        f"algorithm.num_generations_per_prompt={G}",
        "algorithm.max_steps=1",
        *[f"algorithm.{k}={v}" for k, v in algo.items()],
    )


class ScriptedEnv:
    """Rewards set by the answer string: ``"mixed"`` groups score ``[1, 0, ...]``, others 0.

    Each worker scores whole groups (contiguous rows, ``G`` per worker here), so the position
    in the group is the row index modulo ``G``.
    """

    def __init__(self, group: int) -> None:
        self.group = group

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        return torch.tensor(
            [1.0 if a == "mixed" and i % self.group == 0 else 0.0 for i, a in enumerate(answers)],
            dtype=torch.float32,
        )


@pytest.fixture(scope="module")
def policy(ray_cluster: dict[str, str], tq_session: Any) -> Iterator[Any]:
    with observed_tq_policy(ray_cluster, tq_session, _master_config().policy) as p:
        yield p


def _problems(n: int, seed: int = 0) -> list[Problem]:
    return ArithmeticTask(1, ("+",), seed).train_problems(n)


def _loader(problems: list[Problem], batch: int) -> EpochLoader[Problem]:
    return EpochLoader(RLPromptDataset(problems), batch_size=batch, seed=0, shuffle=False)


def _rollout(policy: Any, problems: list[Problem], tag: str) -> Any:
    prompts = [TOK.encode_prompt(p.prompt) for p in problems for _ in range(G)]
    answers = [p.answer for p in problems for _ in range(G)]
    ids = [f"{tag}_p{j}_g{i}" for j in range(len(problems)) for i in range(G)]
    return policy.generate_to_dataplane(
        prompts, list(range(len(ids))), sample_ids=ids, answers=answers, greedy=False,
        tokenizer=TOK, env=ArithmeticEnv(), task_name="train",
    )


def test_full_step_keeps_dtypes_and_reads_fail_after_finish(policy: Any) -> None:
    policy.prepare_step(num_samples=4, group_size=G, extra_fields=("logprobs_bf16",))
    try:
        out = _rollout(policy, _problems(2), "k74")
        meta = out.meta
        assert meta.size == 4 and meta.partition_id == "train"
        assert meta.sample_ids == ["k74_p0_g0", "k74_p0_g1", "k74_p1_g0", "k74_p1_g1"]
        assert set(out.carry.keys()) >= {"rewards", "input_lengths", "prompt_lengths", "truncated"}
        assert all(v.dim() == 1 for v in out.carry.values())
        adv = torch.tensor([0.5, -0.5, 1.0, -1.0]).unsqueeze(1) * torch.ones(4, max(meta.sequence_lengths))
        policy.write_to_dataplane(meta, {"advantages": adv, "sample_mask": torch.ones(4)})
        with pytest.raises(TypeError):  # an overwrite must keep the stored dtype (float32)
            policy.write_to_dataplane(meta, {"sample_mask": torch.ones(4, dtype=torch.float64)})
        policy.get_logprobs_from_meta(meta)
        policy.get_reference_policy_logprobs_from_meta(meta)
        fields = [
            "input_ids", "input_lengths", "token_mask", "sample_mask", "generation_logprobs",
            "prev_logprobs", "reference_policy_logprobs", "advantages",
        ]
        data = policy.read_from_dataplane(meta, select_fields=fields)
        assert data["input_ids"].dtype == torch.int64
        assert data["input_lengths"].dtype == torch.int32
        assert data["token_mask"].dtype == torch.int32
        assert data["sample_mask"].dtype == torch.float32
        for f in ("generation_logprobs", "prev_logprobs", "reference_policy_logprobs", "advantages"):
            assert data[f].dtype == torch.float32, f
        # A bf16 column written by the driver comes back bf16, values intact.
        bf16 = data["prev_logprobs"].to(torch.bfloat16)
        policy.write_to_dataplane(meta, {"logprobs_bf16": bf16})
        back = policy.read_from_dataplane(meta, select_fields=["logprobs_bf16"])["logprobs_bf16"]
        assert back.dtype == torch.bfloat16 and torch.equal(back[:, : bf16.shape[1]], bf16)
        # The workers' write-back equals the legacy in-memory computation on the same rows.
        legacy = policy.get_logprobs(BatchedDataDict({k: data[k] for k in ("input_ids", "input_lengths", "token_mask")}))
        assert torch.equal(legacy["logprobs"], data["prev_logprobs"])
        # Reference = policy before any update (same weights): identical log-probs.
        assert torch.equal(data["reference_policy_logprobs"], data["prev_logprobs"])
        loss_fn = ClippedPGLossFn(
            ratio_clip_min=0.2, ratio_clip_max=0.2, reference_policy_kl_penalty=0.01, token_level_loss=True
        )
        metrics = policy.train_from_meta(meta, loss_fn, eval_mode=True)
        assert metrics["num_optimizer_steps"] == 1 and torch.isfinite(torch.tensor(metrics["loss"]))
        stash = policy.read_from_dataplane(meta, select_fields=["input_ids"])  # logging, before the clear
        assert stash["input_ids"].shape[0] == 4
        policy.finish_step(meta)
        with pytest.raises(KeyError):
            policy.read_from_dataplane(meta, select_fields=["input_ids"])
        assert policy.dp_client.list_sample_ids("train") == []
    finally:
        policy.drop_partition()


def test_dynamic_sampling_on_metas_drops_continues_and_slices(policy: Any) -> None:
    cfg = _master_config(**{"dynamic_sampling.enabled": "true", "dynamic_sampling.max_gen_batches": 3})
    # Batch 1: one mixed group survives (2 rows), one flat group is dropped -> incomplete.
    # Batch 2: two mixed groups -> 6 rows pending > 4: slice to 4, clear 2.
    problems = [
        Problem(prompt="1+1=", answer="mixed"),
        Problem(prompt="2+2=", answer="flat"),
        Problem(prompt="3+3=", answer="mixed"),
        Problem(prompt="4+4=", answer="mixed"),
    ]
    policy.prepare_step(num_samples=4, group_size=G)
    try:
        rows, info = collect_grpo_rows(
            StoreGRPOPath(policy, TOK, ScriptedEnv(G)), cfg, train_loader=_loader(problems, 2), step=1
        )
        meta, carry = rows.handle, rows.carry
        assert info["num_gen_batches"] == 2
        assert info["num_discarded_valid_samples"] == 2
        assert meta.size == 4 and carry.size == 4
        assert meta.sample_ids == ["s1_b0_p0_g0", "s1_b0_p0_g1", "s1_b1_p0_g0", "s1_b1_p0_g1"]
        assert all(t["std"] != 0.0 for t in meta.tags or [])
        assert carry["rewards"].tolist() == [1.0, 0.0, 1.0, 0.0]
        # Dropped (flat group) and sliced (overflow) ids are gone; the survivors are readable.
        assert policy.dp_client.list_sample_ids("train") == sorted(meta.sample_ids)
        ids = policy.read_from_dataplane(meta, select_fields=["input_ids"])["input_ids"]
        assert ids.shape[0] == 4
        assert info["unfiltered_rewards"].shape[0] == 4
        policy.finish_step(meta)
    finally:
        policy.drop_partition()


def test_exceeding_max_gen_batches_raises_and_drops_the_partition(policy: Any, tmp_path: Path) -> None:
    cfg = _master_config(**{"dynamic_sampling.enabled": "true", "dynamic_sampling.max_gen_batches": 2})
    flat = [Problem(prompt=f"{d}+0=", answer="flat") for d in range(4)]
    logger = RunLogger(tmp_path, metrics_file="metrics.jsonl", plot_file="p.png", plot=False,
                       progress_bar=False, label="fail")
    with pytest.raises(ValueError, match="max_gen_batches"):
        grpo_train_sync(
            TrainContext(
                policy=policy, cfg=cfg, train_loader=_loader(flat, 2), val_problems=flat, tokenizer=TOK,
                env=ScriptedEnv(G), logger=logger,
                checkpointer=Checkpointer(tmp_path / "ckpt", enabled=False, save_period=0, keep_last=1),
            )
        )
    assert list(policy.live_partitions()) == []
    assert policy.dp_client.list_sample_ids("train") == []
    policy.prepare_step(num_samples=4, group_size=G)  # the next step can register again
    assert policy.drop_partition() is True


def _walk(obj: Any, path: str, found: list[tuple[str, int]]) -> None:
    """Record every tensor reachable from ``obj`` as (path, ndim)."""
    if isinstance(obj, torch.Tensor):
        found.append((path, obj.dim()))
    elif isinstance(obj, KVBatchMeta):
        for k, v in obj.extra_info.items():
            _walk(v, f"{path}.extra_info[{k}]", found)
    elif isinstance(obj, dict) or isinstance(obj, BatchedDataDict):
        for k, v in obj.items():
            _walk(v, f"{path}[{k!r}]", found)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", found)


#: The log-prob dispatch of each ``algorithm.reuse_train_forward_logprobs`` (the step here is
#: one optimizer step, so ``true`` takes ``prev_logprobs`` from the training forward).
LOGPROB_DISPATCH: dict[str, str] = {
    "false": "get_logprobs_and_reference_presharded",
    "true": "get_reference_policy_logprobs_presharded",
}


@pytest.mark.parametrize("reuse", sorted(LOGPROB_DISPATCH))
def test_no_bulk_per_token_tensor_reaches_the_driver(policy: Any, tmp_path: Path, reuse: str) -> None:
    cfg = _master_config(max_steps=1, val_period=1, reuse_train_forward_logprobs=reuse)
    problems = ArithmeticTask(1, ("+",), 0).train_problems(8)
    received: list[tuple[str, Any]] = []
    group = policy.worker_group
    orig_sharded, orig_all = group.run_sharded, group.run_all

    def run_sharded(method: str, *args: Any, **kwargs: Any) -> list[Any]:
        out = orig_sharded(method, *args, **kwargs)
        received.append((method, out))
        return out

    def run_all(method: str, *args: Any, **kwargs: Any) -> list[Any]:
        out = orig_all(method, *args, **kwargs)
        received.append((method, out))
        return out

    group.run_sharded, group.run_all = run_sharded, run_all
    try:
        logger = RunLogger(tmp_path, metrics_file="metrics.jsonl", plot_file="p.png", plot=False,
                           progress_bar=False, label="rule6")
        result = grpo_train_sync(
            TrainContext(
                policy=policy, cfg=cfg, train_loader=_loader(problems, 2), val_problems=problems[:4],
                tokenizer=TOK, env=ArithmeticEnv(), logger=logger,
                checkpointer=Checkpointer(tmp_path / "ckpt", enabled=False, save_period=0, keep_last=1),
            )
        )
    finally:
        del group.run_sharded, group.run_all
    assert result["step"] == 1
    methods = [m for m, _ in received]
    for expected in ("generate_into_store", LOGPROB_DISPATCH[reuse], "train_presharded"):
        assert expected in methods, methods
    assert (reuse == "true") == ("get_logprobs_presharded" not in methods and LOGPROB_DISPATCH["false"] not in methods)
    tensors: list[tuple[str, int]] = []
    for method, out in received:
        _walk(out, method, tensors)
    per_token = [(p, ndim) for p, ndim in tensors if ndim >= 2]
    assert per_token == [], f"per-token tensors reached the driver: {per_token}"
    assert any("carry" in p for p, _ in tensors)  # the small per-row carry did arrive
    rec = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 1][0]
    # Observability on: per-step store metrics are logged; the driver read nothing back and
    # wrote nothing (advantages and the sample mask travel with the training dispatch).
    assert rec["data_plane/step/bytes_read_mb"] == 0.0
    assert rec["data_plane/step/bytes_written_mb"] == 0.0
    assert rec.get("data_plane/step/put/calls", 0.0) == 0.0
    assert rec["data_plane/step/register/calls"] >= 1.0 and rec["data_plane/step/clear/calls"] >= 1.0
    # ... while the workers fetched the bulk columns themselves.
    assert rec["data_plane/workers/step/bytes_read_mb"] > 0.0
    assert rec["data_plane/workers/step/bytes_written_mb"] > 0.0
    assert policy.dp_client.list_sample_ids("train") == []
