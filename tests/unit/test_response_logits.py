"""The LM head runs on the response only: logits from one before the first masked token.

A loss that reads log-probs only where ``token_mask`` is set (``reads_masked_logprobs_only``,
the built-in NLL and clipped policy-gradient losses) gets ``model(ids, logits_from=k)``, the
logits of positions ``k ..``; the log-prob passes do the same.  Here a real ``PolicyWorker``
(one rank, float32) trains one pass both ways - the same loss class with the flag on and off -
and the loss, every metric and every gradient agree within 1e-6, on the tiny model and on an
HF Llama; ``policy.train_attn_implementation`` switches a HuggingFace model's attention for
the training pass only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_dp.algorithms.loss_functions import ClippedPGLossFn, NLLLoss
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.policy.worker import PolicyWorker
from nemo_dp.models.token_ops import first_logits_position, first_masked_columns, token_logprobs_from_logits
from tests.unit.test_prev_logprob_reuse import _one_pass, hf_rollout, hf_worker, tiny_rollout

TOL = 1e-6


class _FullLogitsPG(ClippedPGLossFn):
    reads_masked_logprobs_only = False


class _FullLogitsNLL(NLLLoss):
    reads_masked_logprobs_only = False


def _record_logits_from(model: torch.nn.Module) -> list[int]:
    seen: list[int] = []

    def hook(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(int(kwargs.get("logits_from", 0)))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def _compare_passes(w: PolicyWorker, data: BatchedDataDict) -> None:
    data = BatchedDataDict({**data, "prev_logprobs": w.get_logprobs(data)["logprobs"]})
    seen = _record_logits_from(w.model)
    for trimmed, full in ((ClippedPGLossFn(0.2, 0.2, 0.05, True), _FullLogitsPG(0.2, 0.2, 0.05, True)),
                          (NLLLoss(), _FullLogitsNLL())):
        seen.clear()
        m_full, g_full = _one_pass(w, data, full)
        assert set(seen) == {0}
        seen.clear()
        m_cut, g_cut = _one_pass(w, data, trimmed)
        assert seen and min(seen) > 0, seen  # the prompt's positions were skipped
        assert set(m_full) == set(m_cut)
        for key in m_full:
            assert abs(m_full[key] - m_cut[key]) <= TOL, (type(trimmed).__name__, key, m_full[key], m_cut[key])
        worst = max(float((a - b).abs().max()) for a, b in zip(g_full, g_cut))
        assert worst <= TOL, (type(trimmed).__name__, worst)
        assert max(float(g.abs().max()) for g in g_cut) > 1e-3


def _compare_logprobs(w: PolicyWorker, data: BatchedDataDict) -> None:
    lp = w.get_logprobs(data)["logprobs"]
    with torch.no_grad():
        full = token_logprobs_from_logits(w.model(data["input_ids"]), data["input_ids"])
    on = data["token_mask"].bool()
    assert float((lp - full)[on].abs().max()) <= TOL
    assert first_logits_position(data["token_mask"]) > 0
    cols = torch.arange(lp.shape[1]).unsqueeze(0)
    before = cols < first_masked_columns(data["token_mask"]).unsqueeze(1)
    assert bool((lp[before] == 0).all())  # each row's prompt columns hold 0
    padding = cols >= data["input_lengths"].unsqueeze(1)
    assert bool((lp[padding] == 0).all())
    # Row by row, so one row per pass zeroes the same columns as the whole batch in one pass
    # (the values differ by float32 rounding only: other matmul shapes).
    single = w.get_logprobs(data, micro_batch_size=1)["logprobs"]
    assert torch.equal(single == 0, lp == 0)
    assert float((single - lp).abs().max()) <= TOL


def test_tiny_model_trains_the_same_on_response_logits() -> None:
    w, data = tiny_rollout()
    _compare_passes(w, data)
    _compare_logprobs(w, data)


def test_hf_llama_trains_the_same_on_response_logits(tmp_path: Path) -> None:
    w, tok = hf_worker(tmp_path)
    data = hf_rollout(w, tok)
    _compare_passes(w, data)
    _compare_logprobs(w, data)


def test_train_attn_implementation_switches_the_training_pass_only(tmp_path: Path) -> None:
    w_sdpa, tok = hf_worker(tmp_path)
    w_eager, _ = hf_worker(tmp_path, train_attn_implementation="eager")
    hf = w_eager.model.hf
    seen: list[str] = []
    hf.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: seen.append(hf.config._attn_implementation))
    data = hf_rollout(w_eager, tok)
    w_sdpa.reference_model.load_state_dict(w_eager.reference_model.state_dict())
    seen.clear()
    data = BatchedDataDict({**data, "prev_logprobs": w_eager.get_logprobs(data)["logprobs"]})
    assert set(seen) == {"sdpa"}  # the log-prob pass keeps the model's attention
    seen.clear()
    m_eager, g_eager = _one_pass(w_eager, data, ClippedPGLossFn(0.2, 0.2, 0.05, True))
    assert set(seen) == {"eager"}
    assert hf.config._attn_implementation == "sdpa"  # restored after the pass
    m_sdpa, g_sdpa = _one_pass(w_sdpa, data, ClippedPGLossFn(0.2, 0.2, 0.05, True))
    # Two attention kernels, the same maths: float32 rounding apart.
    assert abs(m_eager["loss"] - m_sdpa["loss"]) <= 1e-5
    assert max(float((a - b).abs().max()) for a, b in zip(g_eager, g_sdpa)) <= 1e-4


def test_a_bad_train_attn_implementation_names_the_key() -> None:
    from nemo_dp.config.policy import HFPolicyConfig

    with pytest.raises(ValueError, match="policy.train_attn_implementation"):
        HFPolicyConfig(model_name_or_path="/m", train_attn_implementation="flash")


def test_first_logits_position_is_one_before_the_first_masked_column() -> None:
    mask = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]])
    assert first_logits_position(mask) == 2
    assert first_logits_position(torch.zeros(2, 5)) == 0  # nothing masked in: keep every column
    assert first_logits_position(torch.tensor([[1, 1, 0]])) == 0


def test_first_masked_columns_are_per_row_and_the_width_for_an_unmasked_row() -> None:
    mask = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 1, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]])
    assert first_masked_columns(mask).tolist() == [3, 1, 6]
    assert first_masked_columns(mask.bool()).tolist() == [3, 1, 6]


def test_log_probs_of_trailing_logits_equal_the_full_ones_on_their_columns() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 11, generator=g)
    ids = torch.randint(0, 11, (2, 7), generator=g)
    full = token_logprobs_from_logits(logits, ids)
    cut = token_logprobs_from_logits(logits[:, 3:], ids)
    assert torch.equal(cut[:, 4:], full[:, 4:])
    assert bool((cut[:, :4] == 0).all())
    with pytest.raises(ValueError, match="do not match"):
        token_logprobs_from_logits(torch.randn(2, 8, 11), ids)
