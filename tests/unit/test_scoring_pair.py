"""The rollout's tokenizer and env reach the data-plane workers once, then by digest.

Unit tests of the two halves of that exchange, each on a bare object standing in for the
policy or worker (no Ray, no model): what the driver sends, and what a worker scores with.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nemo_dp.models.policy.tq_policy import TQPolicy
from nemo_dp.models.policy.tq_worker import TQPolicyWorker


def _kwargs(driver: SimpleNamespace, tokenizer: object, env: object) -> dict:
    return TQPolicy._scoring_kwargs(driver, tokenizer, env)


def test_the_driver_sends_the_pair_until_the_workers_hold_it_and_again_after_a_change() -> None:
    driver = SimpleNamespace(_scoring_sent=None)
    tokenizer, env = {"vocab": [1, 2, 3]}, {"reward": "math"}
    first = _kwargs(driver, tokenizer, env)
    assert first["tokenizer"] is tokenizer and first["env"] is env
    assert first == _kwargs(driver, tokenizer, env)  # not yet confirmed sent: sent again
    driver._scoring_sent = first["scoring_digest"]
    assert _kwargs(driver, tokenizer, env) == {"scoring_digest": first["scoring_digest"]}
    env["reward"] = "exact"  # a change in place is a new pair
    changed = _kwargs(driver, tokenizer, env)
    assert changed["scoring_digest"] != first["scoring_digest"] and changed["env"] is env


def test_a_worker_keeps_the_pair_sent_with_a_digest_and_scores_with_it_later() -> None:
    worker = SimpleNamespace(rank=1)
    tokenizer, env = object(), object()
    assert TQPolicyWorker._scoring_pair(worker, tokenizer, env, "d1") == (tokenizer, env)
    assert TQPolicyWorker._scoring_pair(worker, None, None, "d1") == (tokenizer, env)
    other = object()
    assert TQPolicyWorker._scoring_pair(worker, other, env, "d2") == (other, env)
    assert TQPolicyWorker._scoring_pair(worker, None, None, "d2") == (other, env)


def test_a_digest_the_worker_does_not_hold_is_refused_by_name() -> None:
    worker = SimpleNamespace(rank=0)
    with pytest.raises(RuntimeError, match=r"TQPolicyWorker\[0\].*scoring_digest abc .*holds none"):
        TQPolicyWorker._scoring_pair(worker, None, None, "abc")
    TQPolicyWorker._scoring_pair(worker, object(), object(), "d1")
    with pytest.raises(RuntimeError, match="scoring_digest abc .*holds d1"):
        TQPolicyWorker._scoring_pair(worker, None, None, "abc")


def test_without_a_digest_the_pair_passes_through_unkept() -> None:
    worker = SimpleNamespace(rank=0)
    tokenizer, env = object(), object()
    assert TQPolicyWorker._scoring_pair(worker, tokenizer, env, None) == (tokenizer, env)
    assert not hasattr(worker, "_scoring_held")
