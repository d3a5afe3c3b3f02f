"""``ValueWorker`` in-process (world size 1, no Ray): values alignment/masking, backbone copy
from a policy, a frozen LM head, and that training with ``ClippedValueLossFn`` fits the returns."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nemo_dp.algorithms.ppo_losses import ClippedValueLossFn
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models.builders import build_model
from nemo_dp.models.value.worker import VALUE_HEAD_PARAMS, ValueWorker

VOCAB = 20


def tiny_worker_cfg(
    *, max_seq_len: int = 12, lr: float = 3e-3, logprob_batch_size: int = 3, dp_size: int = 1, **extra: Any
) -> dict[str, Any]:
    """A one-layer tiny-model ``policy`` node (gbs 4, mbs 2, AdamW) with ``extra`` keys set over it."""
    return {
        "dp_size": dp_size,
        "torch_threads": 1,
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "max_seq_len": max_seq_len, "dropout": 0.0},
        "optimizer": {
            "name": "adamw", "lr": lr, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.99,
            "eps": 1e-8, "warmup_steps": 0, "schedule": "constant", "min_lr_ratio": 0.1,
        },
        "train_global_batch_size": 4,
        "train_micro_batch_size": 2,
        "logprob_batch_size": logprob_batch_size,
        "max_grad_norm": 1.0,
        "dynamic_batching": {"enabled": False},
        "sequence_packing": {"enabled": False},
        **extra,
    }


def _cfg() -> dict[str, Any]:
    return tiny_worker_cfg()


def _worker() -> ValueWorker:
    return ValueWorker(rank=0, world_size=1, policy_cfg=_cfg(), vocab_size=VOCAB, pad_id=0, eos_id=2, seed=3)


def _batch() -> BatchedDataDict:
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([6, 4, 8, 5], dtype=torch.int32)
    ids = torch.randint(3, VOCAB, (4, 8), generator=gen)
    pos = torch.arange(8).unsqueeze(0)
    valid = pos < lengths.unsqueeze(1).long()
    ids = torch.where(valid, ids, torch.zeros_like(ids))
    token_mask = (valid & (pos >= 2)).to(torch.int32)
    per_row = torch.tensor([[1.0], [-0.5], [0.25], [2.0]]).expand(4, 8)
    returns = torch.where(token_mask.bool(), per_row, torch.zeros(4, 8))
    return BatchedDataDict(
        {"input_ids": ids, "input_lengths": lengths, "token_mask": token_mask,
         "sample_mask": torch.ones(4), "returns": returns, "values": torch.zeros(4, 8)}
    )


def test_values_start_at_zero_are_aligned_and_masked() -> None:
    w = _worker()
    data = _batch()
    assert float(w.get_values(data)["values"].abs().sum()) == 0.0  # zero-initialised head
    with torch.no_grad():
        w.model.value_head.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
    v = w.get_values(data)["values"]  # micro-batches of 3 rows (logprob_batch_size)
    raw = w.model(data["input_ids"])
    lengths = data["input_lengths"].tolist()
    for i, n in enumerate(lengths):
        assert v[i, 0] == 0
        torch.testing.assert_close(v[i, 1:n], raw[i, : n - 1], rtol=1e-5, atol=1e-6)
        assert bool((v[i, n:] == 0).all())
    with pytest.raises(RuntimeError, match="cannot generate"):
        w.generate({"prompts": [[1]], "seeds": [0]}, True)


def test_init_trunk_from_policy_copies_all_but_the_head() -> None:
    w = _worker()
    policy = build_model(_cfg(), vocab_size=VOCAB, seed=99)
    with torch.no_grad():
        w.model.value_head.weight.fill_(0.5)
    copied = w.init_trunk_from(policy.state_dict())
    own = w.model.state_dict()
    assert copied == len(own) - len(VALUE_HEAD_PARAMS) == len(policy.state_dict())
    for k, v in policy.state_dict().items():
        assert torch.equal(own["backbone." + k], v)
    assert bool((own["value_head.weight"] == 0.5).all())  # the head is kept
    bad = {k: v for k, v in policy.state_dict().items() if k != "ln_f.weight"}
    with pytest.raises(KeyError, match="ln_f.weight"):
        w.init_trunk_from(bad)


def test_lm_head_is_frozen_and_untouched_by_training() -> None:
    w = _worker()
    head = w.model.backbone.lm_head_only_parameters()[0]
    before = head.detach().clone()
    assert not head.requires_grad
    w.train(_batch(), ClippedValueLossFn(value_clip=10.0))
    assert torch.equal(head, before)
    assert head.grad is None


def test_training_fits_the_returns() -> None:
    w = _worker()
    data = _batch()
    loss_fn = ClippedValueLossFn(value_clip=10.0)
    first = w.train(data, loss_fn)["per_step"][0]["value_loss"]
    for _ in range(60):
        data["values"] = w.get_values(data)["values"]
        last = w.train(data, loss_fn)["per_step"][0]["value_loss"]
    # Zero-initialised head: the first loss is half the mean squared return.
    expected = 0.5 * float((data["returns"] ** 2).sum() / data["token_mask"].sum())
    assert first == pytest.approx(expected, rel=1e-5)
    assert last < 0.2 * first
