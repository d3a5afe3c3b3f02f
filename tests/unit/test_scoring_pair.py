"""The rollout's tokenizer and env reach the data-plane workers once, then by digest.

Unit tests of the two halves of that exchange (no Ray, no model): what a driver sends a worker,
and what a worker scores with.
"""

from __future__ import annotations

import pytest

from nemo_dp.models.policy.scoring_pair import ScoringPairHolder, ScoringPairSender, pair_digest


def _kwargs(sender: ScoringPairSender, worker: int, tokenizer: object, env: object) -> dict:
    return sender.kwargs(worker, pair_digest(tokenizer, env), tokenizer, env)


def test_the_driver_sends_the_pair_until_the_workers_hold_it_and_again_after_a_change() -> None:
    sender = ScoringPairSender()
    tokenizer, env = {"vocab": [1, 2, 3]}, {"reward": "math"}
    first = _kwargs(sender, 0, tokenizer, env)
    assert first["tokenizer"] is tokenizer and first["env"] is env
    assert first == _kwargs(sender, 0, tokenizer, env)  # not yet confirmed sent: sent again
    sender.sent(0, first["scoring_digest"])
    assert _kwargs(sender, 0, tokenizer, env) == {"scoring_digest": first["scoring_digest"]}
    assert _kwargs(sender, 1, tokenizer, env) == first  # another worker does not hold it
    env["reward"] = "exact"  # a change in place is a new pair
    changed = _kwargs(sender, 0, tokenizer, env)
    assert changed["scoring_digest"] != first["scoring_digest"] and changed["env"] is env


def test_a_worker_keeps_the_pair_sent_with_a_digest_and_scores_with_it_later() -> None:
    holder = ScoringPairHolder("TQPolicyWorker[1]")
    tokenizer, env = object(), object()
    assert holder.resolve(tokenizer, env, "d1") == (tokenizer, env)
    assert holder.resolve(None, None, "d1") == (tokenizer, env)
    other = object()
    assert holder.resolve(other, env, "d2") == (other, env)
    assert holder.resolve(None, None, "d2") == (other, env)


def test_a_digest_the_worker_does_not_hold_is_refused_by_name() -> None:
    holder = ScoringPairHolder("TQPolicyWorker[0]")
    with pytest.raises(RuntimeError, match=r"TQPolicyWorker\[0\].*scoring_digest abc .*holds none"):
        holder.resolve(None, None, "abc")
    holder.resolve(object(), object(), "d1")
    with pytest.raises(RuntimeError, match="scoring_digest abc .*holds d1"):
        holder.resolve(None, None, "abc")


def test_without_a_digest_the_pair_passes_through_unkept() -> None:
    holder = ScoringPairHolder("RolloutWorker[0]")
    tokenizer, env = object(), object()
    assert holder.resolve(tokenizer, env, None) == (tokenizer, env)
    with pytest.raises(RuntimeError, match="holds none"):
        holder.resolve(None, None, "d1")
