"""Unit tests of asynchronous GRPO's pure parts (no Ray).

Isolated here: the ``algorithm.async_rollout`` config and its selection rule, the truncated
importance-weighted loss against ``ClippedPGLossFn``, the staleness / idle metrics, the
exactly-once ledger, and the rollout shard split.  The trainer loop itself runs against real
Ray + TransferQueue in ``tests/e2e/test_grpo_async_*.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nemo_dp.algorithms.async_ledger import AsyncLedger, read_ledger
from nemo_dp.algorithms.async_losses import TruncatedISClippedPGLoss, truncated_importance_weights
from nemo_dp.algorithms.async_metrics import idle_metrics, staleness_metrics
from nemo_dp.algorithms.loss_functions import ClippedPGLossFn
from nemo_dp.config.async_rollout import (
    AsyncRolloutConfig,
    async_rollout_enabled,
    coerce_async_rollout_config,
    validate_async_rollout_selection,
)
from nemo_dp.models.policy.rollout_worker import POLICY_VERSION, shard_bounds

REPO_ROOT = Path(__file__).resolve().parents[2]


# --- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_staleness", -1),
        ("num_rollout_workers", 0),
        ("importance_ratio_cap", 0.5),
        ("claim_poll_interval_s", 0.0),
        ("claim_timeout_s", -1.0),
        ("torch_threads", -1),
    ],
)
def test_out_of_range_values_name_the_key(key: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"algorithm.async_rollout.{key}"):
        AsyncRolloutConfig(**{key: value})


def test_unknown_key_is_named() -> None:
    with pytest.raises(ValueError, match="algorithm.async_rollout.max_stalenes: unknown key"):
        coerce_async_rollout_config({"max_stalenes": 1})
    assert coerce_async_rollout_config({"max_staleness": 3}).max_staleness == 3
    assert coerce_async_rollout_config(None) == AsyncRolloutConfig()


def _master(dp: dict | None, *, enabled: bool = True, dynamic: bool = False, name: str = "grpo") -> dict:
    return {
        "algorithm": {
            "name": name,
            "async_rollout": {"enabled": enabled},
            "dynamic_sampling": {"enabled": dynamic},
        },
        "data_plane": dp,
    }


TQ = {"enabled": True, "impl": "transfer_queue"}


def test_selection_rule() -> None:
    assert validate_async_rollout_selection(_master(TQ)) is True
    assert validate_async_rollout_selection(_master(TQ, enabled=False)) is False
    assert validate_async_rollout_selection(_master(None, enabled=False)) is False
    assert async_rollout_enabled(_master(TQ, name="ppo")) is False
    for dp in (None, {"enabled": False}, {"enabled": True, "impl": "local"}):
        with pytest.raises(ValueError, match=r"algorithm\.async_rollout\.enabled=true needs data_plane=tq") as err:
            validate_async_rollout_selection(_master(dp))
        assert "data_plane" in str(err.value)
    with pytest.raises(ValueError, match="algorithm.dynamic_sampling.enabled"):
        validate_async_rollout_selection(_master(TQ, dynamic=True))
    with pytest.raises(TypeError, match="algorithm.async_rollout.enabled must be a bool"):
        async_rollout_enabled({"algorithm": {"name": "grpo", "async_rollout": {"enabled": "yes"}}})


def _compose(*overrides: str, recipe: str | None = None):
    from tests.compose import compose_run

    head = ["~recipe", "algorithm=grpo"] if recipe is None else [f"recipe={recipe}"]
    return compose_run([*head, *overrides])


def test_factory_selects_the_async_trainer_only_with_tq() -> None:
    from nemo_dp.config import validate_config
    from nemo_dp.config.trainer_lookup import validate_trainer_selection

    cfg = _compose("data_plane=tq", "algorithm.async_rollout.enabled=true")
    validate_config(cfg)
    sel = validate_trainer_selection(cfg)
    assert sel.target == "nemo_dp.algorithms.grpo_async:grpo_train_async"
    assert sel.progress_line.startswith("Running asynchronous GRPO training")
    off = _compose("data_plane=tq")
    assert validate_trainer_selection(off).target == "nemo_dp.algorithms.grpo_sync:grpo_train_sync"
    for dp in ("disabled", "local"):
        bad = _compose(f"data_plane={dp}", "algorithm.async_rollout.enabled=true")
        with pytest.raises(ValueError, match=r"algorithm\.async_rollout\.enabled=true needs data_plane=tq"):
            validate_config(bad)


def test_grpo_recipe_composes() -> None:
    from nemo_dp.config import validate_config

    from nemo_dp.config.trainer_lookup import validate_trainer_selection

    cfg = _compose(recipe="grpo_async_arith")
    obj = validate_config(cfg)
    assert obj.algorithm.async_rollout.enabled is True
    assert validate_trainer_selection(cfg).target.endswith("grpo_async:grpo_train_async")
    # Everything but the data plane and the async block equals the main job's recipe.
    main = _compose(recipe="arith_main")
    assert cfg.algorithm.warm_start == main.algorithm.warm_start and cfg.policy == main.policy
    for key in ("max_steps", "num_prompts_per_step", "val_period", "val_samples", "loss"):
        assert cfg.algorithm[key] == main.algorithm[key], key


# --- loss ----------------------------------------------------------------------------------------


def _mb(b: int = 3, s: int = 6, v: int = 11, seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, s, v, generator=g, requires_grad=True)
    token_mask = torch.zeros(b, s, dtype=torch.int32)
    token_mask[:, 2:5] = 1
    mb = {
        "input_ids": torch.randint(0, v, (b, s), generator=g),
        "token_mask": token_mask,
        "sample_mask": torch.ones(b),
        "prev_logprobs": -torch.rand(b, s, generator=g),
        "generation_logprobs": -torch.rand(b, s, generator=g),
        "reference_policy_logprobs": -torch.rand(b, s, generator=g),
        "advantages": torch.randn(b, 1, generator=g).expand(b, s) * token_mask,
    }
    return logits, mb


def test_fresh_rows_give_exactly_the_clipped_pg_loss() -> None:
    logits, mb = _mb()
    mb[POLICY_VERSION] = torch.tensor([4, 4, 4])
    base = ClippedPGLossFn(0.2, 0.2, 0.01, True)
    corrected = TruncatedISClippedPGLoss(0.2, 0.2, 0.01, True, importance_ratio_cap=2.0, trainer_version=4)
    l1, m1 = base(logits, mb, 9.0, 3.0)
    (g1,) = torch.autograd.grad(l1, logits)
    l2, m2 = corrected(logits, mb, 9.0, 3.0)
    (g2,) = torch.autograd.grad(l2, logits)
    assert torch.equal(l1, l2) and torch.equal(g1, g2)
    assert {k: m2[k] for k in m1} == m1
    assert m2["is_weight"] == pytest.approx(1.0)


def test_stale_rows_are_reweighted_and_truncated() -> None:
    prev = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    gen = torch.log(torch.tensor([[0.25, 0.5], [0.3, 0.1]]))
    w = truncated_importance_weights(prev, gen, torch.tensor([1, 0]), cap=1.5)
    assert torch.allclose(w[0], torch.tensor([1.5, 1.0]))  # 2.0 truncated to the cap
    assert torch.equal(w[1], torch.ones(2))  # lag 0: exactly 1 whatever the log-probs
    logits, mb = _mb()
    mb[POLICY_VERSION] = torch.tensor([3, 4, 2])
    base = ClippedPGLossFn(0.2, 0.2, 0.0, True)
    corrected = TruncatedISClippedPGLoss(0.2, 0.2, 0.0, True, importance_ratio_cap=2.0, trainer_version=4)
    l1, _ = base(logits, mb, 9.0, 3.0)
    l2, m2 = corrected(logits, mb, 9.0, 3.0)
    assert not torch.equal(l1, l2)
    # Same loss by hand: per-token clipped PG times the truncated weight.
    from nemo_dp.algorithms.loss_functions import token_logprobs_from_logits

    logp = token_logprobs_from_logits(logits, mb["input_ids"])
    ratio = torch.exp(logp - mb["prev_logprobs"])
    adv = mb["advantages"].float()
    pg = torch.maximum(-ratio * adv, -ratio.clamp(0.8, 1.2) * adv)
    lag = torch.tensor([1, 0, 2])
    weight = torch.where(
        (lag > 0).unsqueeze(1), torch.exp(mb["prev_logprobs"] - mb["generation_logprobs"]).clamp(max=2.0), 1.0
    )
    expected = (pg * weight * mb["token_mask"]).sum() / 9.0
    assert torch.allclose(l2, expected)
    assert m2["is_weight"] != pytest.approx(1.0)


def test_a_row_newer_than_the_trainer_is_refused() -> None:
    logits, mb = _mb()
    mb[POLICY_VERSION] = torch.tensor([5, 4, 4])
    loss = TruncatedISClippedPGLoss(0.2, 0.2, 0.0, True, importance_ratio_cap=2.0, trainer_version=4)
    with pytest.raises(ValueError, match="newer than the trainer's version 4"):
        loss(logits, mb, 9.0, 3.0)
    with pytest.raises(ValueError, match="importance_ratio_cap"):
        TruncatedISClippedPGLoss(0.2, 0.2, 0.0, True, importance_ratio_cap=0.9, trainer_version=0)
    del mb[POLICY_VERSION]
    with pytest.raises(KeyError, match="policy_version"):
        loss(logits, mb, 9.0, 3.0)


# --- metrics -------------------------------------------------------------------------------------


def test_staleness_histogram() -> None:
    m = staleness_metrics([0, 1, 1, 2], 2)
    assert m == {
        "async/staleness_mean": 1.0,
        "async/staleness_max": 2.0,
        "async/staleness_hist/0": 1.0,
        "async/staleness_hist/1": 2.0,
        "async/staleness_hist/2": 1.0,
    }
    with pytest.raises(ValueError, match=r"policy lags \[3\] outside \[0, algorithm.async_rollout.max_staleness=2\]"):
        staleness_metrics([0, 3], 2)
    with pytest.raises(ValueError, match="no rows"):
        staleness_metrics([], 1)


def test_idle_fractions() -> None:
    m = idle_metrics(wall_s=10.0, claim_wait_s=2.5, rollout_busy_s=12.0, num_rollout_workers=2,
                     window={"rollout_gen_s": 11.0})
    assert m == {"async/trainer_idle_frac": 0.25, "async/rollout_idle_frac": 0.4, "time/rollout_gen_s": 11.0}
    assert idle_metrics(wall_s=1.0, claim_wait_s=2.0, rollout_busy_s=5.0, num_rollout_workers=1) == {
        "async/trainer_idle_frac": 1.0,
        "async/rollout_idle_frac": 0.0,
    }
    with pytest.raises(ValueError, match="wall_s"):
        idle_metrics(wall_s=0.0, claim_wait_s=0.0, rollout_busy_s=0.0, num_rollout_workers=1)


# --- ledger --------------------------------------------------------------------------------------


def test_ledger_truncates_on_resume(tmp_path: Path) -> None:
    ledger = AsyncLedger(tmp_path)
    ledger.truncate_after(0)
    for step in (1, 2, 3):
        ledger.append(step, epoch=0, indices=[step * 2, step * 2 + 1], sample_ids=[f"a{step}"], version=step - 1)
    ledger.truncate_after(2)
    ledger.append(3, epoch=0, indices=[9], sample_ids=["b3"], version=2)
    recs = read_ledger(ledger.path)
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[2]["indices"] == [9] and recs[2]["generated_with_version"] == 2
    ledger.path.write_text(json.dumps(recs[0]) + "\nnot json\n")
    with pytest.raises(ValueError, match=r"async_ledger.jsonl:2"):
        read_ledger(ledger.path)


# --- advantages shipped to the rollout actors -------------------------------------------------


@pytest.mark.parametrize("leave_one_out,normalize", [(True, True), (False, True), (True, False), (False, False)])
def test_group_advantages_equal_the_synchronous_estimator(leave_one_out: bool, normalize: bool) -> None:
    import pickle

    from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std
    from nemo_dp.algorithms.async_advantages import GroupAdvantages

    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    fn = GroupAdvantages(group_size=4, leave_one_out=leave_one_out, normalize_rewards=normalize)
    # The actors receive it pickled; the copy must compute the same thing.
    baseline, std, adv = pickle.loads(pickle.dumps(fn))(rewards)
    want_b, want_s = grpo_baseline_and_std(rewards, 4, leave_one_out)
    assert torch.equal(baseline, want_b) and torch.equal(std, want_s)
    assert torch.equal(adv, grpo_advantages(rewards, want_b, want_s, normalize))
    assert adv.abs().sum() > 0  # mixed groups: the comparison is not between zeros
    with pytest.raises(ValueError, match="not a multiple of group_size=4"):
        fn(rewards[:6])


def test_group_advantages_read_the_algorithm_config() -> None:
    from nemo_dp.algorithms.async_advantages import GroupAdvantages

    cfg = _compose("data_plane=tq", "algorithm.async_rollout.enabled=true",
                   "algorithm.num_generations_per_prompt=3", "algorithm.use_leave_one_out_baseline=false",
                   "algorithm.normalize_rewards=true")
    assert GroupAdvantages.from_algorithm(cfg.algorithm) == GroupAdvantages(3, False, True)


# --- shards --------------------------------------------------------------------------------------


def test_shards_follow_the_synchronous_split_and_keep_groups_whole() -> None:
    # 4 prompts x 4 generations over 2 ranks: Policy.generate's contiguous halves.
    assert shard_bounds(4, 4, 2) == [(0, 8), (8, 16)]
    # 3 prompts x 2 over 2 ranks: ceil(6/2)=3 rows would cut a group -> whole groups 2 + 1.
    assert shard_bounds(3, 2, 2) == [(0, 4), (4, 6)]
    assert shard_bounds(1, 4, 2) == [(0, 4), (4, 4)]
    for p, g, d in ((5, 3, 2), (7, 4, 3), (2, 8, 4)):
        bounds = shard_bounds(p, g, d)
        assert len(bounds) == d and bounds[0][0] == 0 and bounds[-1][1] == p * g
        assert all(a % g == 0 and b % g == 0 and a <= b for a, b in bounds)
        assert all(bounds[i][1] == bounds[i + 1][0] for i in range(d - 1))
    with pytest.raises(ValueError, match="num_prompts=0"):
        shard_bounds(0, 2, 2)


# --- design rules for the new modules ------------------------------------------------------------


ASYNC_MODULES = sorted((REPO_ROOT / "nemo_dp" / "algorithms").glob("async_*.py")) + [
    REPO_ROOT / "nemo_dp" / "algorithms" / "grpo_async.py"
]


@pytest.mark.parametrize("path", ASYNC_MODULES, ids=[p.name for p in ASYNC_MODULES])
def test_async_trainer_modules_reach_the_store_only_through_policy_facades(path: Path) -> None:
    """No ``dp_client``, no client builder and no data-plane gate in the asynchronous trainer.

    Its imports (no adapter, client helper, Ray or TransferQueue) are the import contract
    ``data-plane-trainers-without-adapters`` in pyproject.toml.
    """
    import ast

    tree = ast.parse(path.read_text(), filename=str(path))
    imported = [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module for a in n.names]
    bad = [m for m in imported if m.endswith(".build_data_plane_client")]
    assert bad == [], f"{path.name} imports the client builder: {bad}"
    touched = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "dp_client"]
    touched += [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "dp_client"]
    assert touched == [], f"{path.name} touches the client directly"
    gates = [ast.unparse(n.test) for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp, ast.While))]
    assert [g for g in gates if "data_plane" in g or "dp_client" in g] == []


def test_the_async_rule_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "async_bad.py"
    bad.write_text("from nemo_dp.data_plane.factory import build_data_plane_client\n")
    with pytest.raises(AssertionError, match="imports the client builder"):
        test_async_trainer_modules_reach_the_store_only_through_policy_facades(bad)
    bad.write_text("def f(policy):\n    return policy.dp_client\n")
    with pytest.raises(AssertionError, match="touches the client directly"):
        test_async_trainer_modules_reach_the_store_only_through_policy_facades(bad)
