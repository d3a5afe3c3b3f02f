"""``prev_logprobs`` from the training forward equal a separate log-prob forward's.

When a GRPO rollout is consumed by one optimizer step, the separate no-grad forward before
training computes the log-probs the training forward computes with the same weights.  Here a
real ``PolicyWorker`` (one rank, float32) runs one training microbatch pass both ways - with
``prev_logprobs`` from ``get_logprobs`` and with ``prev_logprobs_from_forward`` - and the loss,
every metric and every gradient agree within 1e-6; ``logprob_plan`` decides when a trainer
takes that path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from nemo_dp.algorithms.grpo_common import SEPARATE_FORWARD, TRAIN_FORWARD, logprob_plan
from nemo_dp.algorithms.loss_functions import ClippedPGLossFn
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.policy.worker import PolicyWorker
from tests.unit.test_precision import _tiny

TOL = 1e-6


def _worker(cfg: dict[str, Any], vocab: int, pad: int, eos: int) -> PolicyWorker:
    return PolicyWorker(rank=0, world_size=1, policy_cfg=cfg, vocab_size=vocab, pad_id=pad, eos_id=eos, seed=3)


def _rollout(w: PolicyWorker, prompts: list[list[int]]) -> BatchedDataDict:
    g = w.generate({"prompts": prompts, "seeds": list(range(len(prompts)))}, False)
    n = g["input_ids"].shape[0]
    adv = torch.linspace(-1.5, 2.0, n).unsqueeze(1) * g["token_mask"].float()
    data = BatchedDataDict(
        {"input_ids": g["input_ids"], "input_lengths": g["input_lengths"], "token_mask": g["token_mask"],
         "sample_mask": torch.ones(n), "generation_logprobs": g["generation_logprobs"], "advantages": adv}
    )
    w.model.train()
    # A reference a little away from the policy, so that the KL term has a gradient too.
    with torch.no_grad():
        for p in w.reference_model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    data["reference_policy_logprobs"] = w.get_reference_policy_logprobs(data)["reference_logprobs"]
    return data


def _one_pass(
    w: PolicyWorker, data: BatchedDataDict, loss_fn: ClippedPGLossFn
) -> tuple[dict[str, float], list[torch.Tensor]]:
    w.begin_train_step(loss_fn)
    w.train_microbatch(data)
    metrics = dict(w._step_state["metrics"])  # type: ignore[index]
    grads = [p.grad.detach().clone() for p in w.model.parameters()]
    w.abort_train_step()
    return metrics, grads


def _loss(reuse: bool) -> ClippedPGLossFn:
    return ClippedPGLossFn(0.2, 0.2, 0.05, True, prev_logprobs_from_forward=reuse)


def _compare(w: PolicyWorker, data: BatchedDataDict) -> None:
    separate = BatchedDataDict({**data, "prev_logprobs": w.get_logprobs(data)["logprobs"]})
    m_sep, g_sep = _one_pass(w, separate, _loss(False))
    m_re, g_re = _one_pass(w, data, _loss(True))  # no prev_logprobs in the batch at all
    assert "prev_logprobs" not in data
    assert set(m_sep) == set(m_re)
    for key in m_sep:
        assert abs(m_sep[key] - m_re[key]) <= TOL, (key, m_sep[key], m_re[key])
    assert abs(m_re["probs_ratio"] - 1.0) <= TOL  # the ratio is 1 on every token
    worst = max(float((a - b).abs().max()) for a, b in zip(g_sep, g_re))
    assert worst <= TOL, worst
    assert max(float(g.abs().max()) for g in g_re) > 1e-3  # a real gradient, not two zeros

    # The comparison can fail: log-probs of other weights give another gradient.
    shifted = BatchedDataDict({**separate, "prev_logprobs": separate["prev_logprobs"] - 0.05 * data["token_mask"]})
    _, g_off = _one_pass(w, shifted, _loss(False))
    assert max(float((a - b).abs().max()) for a, b in zip(g_off, g_re)) > 100 * TOL


#: Arithmetic prompts the tiny model (all six) and the HF Llama (the first four) roll out.
PROMPTS = ("1+2=", "30+4=", "7+7=", "12+9=", "5+0=", "44+1=")


def tiny_rollout() -> tuple[PolicyWorker, BatchedDataDict]:
    """A float32 tiny-model worker (char tokenizer) and its rollout of :data:`PROMPTS`."""
    from nemo_dp.models.tiny.tokenizer import CharTokenizer

    tok = CharTokenizer()
    cfg = _tiny(model={"n_layers": 2, "d_model": 32, "n_heads": 2, "max_seq_len": 20, "dropout": 0.0},
                train_micro_batch_size=3, logprob_batch_size=8, generation={"max_new_tokens": 6, "temperature": 1.0})
    w = _worker(cfg, tok.vocab_size, tok.pad_id, tok.eos_id)
    return w, _rollout(w, [tok.encode_prompt(p) for p in PROMPTS])


def hf_worker(tmp_path: Path, **extra: Any) -> tuple[PolicyWorker, Any]:
    """A float32 worker on the offline tiny HF Llama built in ``tmp_path`` (policy keys ``extra``); its tokenizer."""
    from nemo_dp.models.builders import build_tokenizer
    from nemo_dp.models.hf.make_tiny import ensure_tiny_checkpoint

    llama = ensure_tiny_checkpoint("llama", tmp_path)
    cfg = _tiny(kind="hf", model_name_or_path=str(llama), tokenizer_name_or_path=None, precision="32-true",
                dtype=None, attn_implementation="sdpa", trust_remote_code=False, device="cpu",
                model={"max_seq_len": 64}, train_micro_batch_size=2,
                generation={"max_new_tokens": 5, "temperature": 1.0}, **extra)
    tok = build_tokenizer(cfg)
    return _worker(cfg, tok.vocab_size, tok.pad_id, tok.eos_id), tok


def hf_rollout(w: PolicyWorker, tok: Any) -> BatchedDataDict:
    """``w``'s rollout of the first four :data:`PROMPTS`."""
    return _rollout(w, [tok.encode_prompt(p) for p in PROMPTS[:4]])


def test_reuse_equals_the_separate_forward_on_the_tiny_model() -> None:
    _compare(*tiny_rollout())


def test_reuse_equals_the_separate_forward_on_an_hf_llama(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    w, tok = hf_worker(tmp_path)
    _compare(w, hf_rollout(w, tok))


def _cfg(prompts: int, gens: int, gbs: int, reuse: bool = True, kl: float = 0.01) -> Any:
    return OmegaConf.create(
        {"algorithm": {"num_prompts_per_step": prompts, "num_generations_per_prompt": gens,
                       "reuse_train_forward_logprobs": reuse, "loss": {"reference_policy_kl_penalty": kl}},
         "policy": {"train_global_batch_size": gbs}}
    )


def test_the_plan_reuses_only_when_the_rollout_is_one_optimizer_step() -> None:
    one = logprob_plan(_cfg(4, 4, 16))
    assert one.reuse_train_forward and one.reference and one.prev_logprobs_source == TRAIN_FORWARD
    assert one.skipped_fields == {"prev_logprobs"}
    two = logprob_plan(_cfg(4, 4, 8))  # two optimizer steps: the second needs the old log-probs
    assert not two.reuse_train_forward and two.prev_logprobs_source == SEPARATE_FORWARD and not two.skipped_fields
    assert not logprob_plan(_cfg(4, 4, 16, reuse=False)).reuse_train_forward
    no_kl = logprob_plan(_cfg(4, 4, 8, kl=0.0))
    assert not no_kl.reference and no_kl.skipped_fields == {"reference_policy_logprobs"}
    assert logprob_plan(_cfg(4, 4, 16, kl=0.0)).skipped_fields == {"prev_logprobs", "reference_policy_logprobs"}


def test_the_loss_asks_for_prev_logprobs_only_without_reuse() -> None:
    mb = {"input_ids": torch.zeros(1, 3, dtype=torch.long), "token_mask": torch.ones(1, 3, dtype=torch.int32),
          "sample_mask": torch.ones(1), "advantages": torch.ones(1, 3)}
    logits = torch.zeros(1, 3, 5, requires_grad=True)
    with pytest.raises(KeyError, match="prev_logprobs"):
        ClippedPGLossFn(0.2, 0.2, 0.0, True)(logits, mb, 3.0, 1.0)
    loss, metrics = ClippedPGLossFn(0.2, 0.2, 0.0, True, prev_logprobs_from_forward=True)(logits, mb, 3.0, 1.0)
    assert metrics["probs_ratio"] == 1.0
    loss.backward()
    assert logits.grad is not None and float(logits.grad.abs().sum()) > 0
