"""``policy.precision``: the keys, the weights' dtype and where bfloat16 autocast is active.

The workers here are real ``PolicyWorker`` / ``ValueWorker`` instances (one rank, no process
group) on the tiny model and the offline tiny HF Llama; forward hooks record whether autocast
was on inside the model's forward, and a wrapping loss records the dtype its logits arrived in
and whether autocast was on while the loss (log-softmax included) ran.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from nemo_dp.algorithms.loss_functions import NLLLoss
from nemo_dp.config.policy import HFPolicyConfig, TinyPolicyConfig
from nemo_dp.distributed.batched_data_dict import BatchedDataDict
from nemo_dp.models import precision as precision_mod
from nemo_dp.models.builders import validate_policy
from nemo_dp.models.precision import Precision, resolve_precision, warn_if_no_bf16
from nemo_dp.models.policy.worker import PolicyWorker
from nemo_dp.models.value.worker import ValueWorker
from tests.unit.test_value_worker import VOCAB, _batch, tiny_worker_cfg  # the same 4-row masked batch


def _tiny(**kw: Any) -> dict[str, Any]:
    cfg = tiny_worker_cfg(
        max_seq_len=16, logprob_batch_size=4, kind="tiny", generation={"max_new_tokens": 3, "temperature": 1.0},
        generation_batch_size=4,
    )
    cfg.update(kw)
    return cfg


class _Recorder:
    """Forward hooks on every ``nn.Linear`` of a model: was autocast on, what dtype came out."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.autocast: list[bool] = []
        self.out_dtypes: set[torch.dtype] = set()
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.register_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any, out: torch.Tensor) -> None:
        self.autocast.append(torch.is_autocast_enabled("cpu"))
        self.out_dtypes.add(out.dtype)

    def clear(self) -> None:
        self.autocast.clear()
        self.out_dtypes.clear()


class _LossProbe(NLLLoss):
    """NLL that records the dtype of the logits it got and whether autocast was on around it."""

    def __init__(self) -> None:
        self.logit_dtypes: set[torch.dtype] = set()
        self.autocast_in_loss: set[bool] = set()

    def __call__(self, logits: torch.Tensor, mb: Any, tokens: float, seqs: float) -> Any:
        self.logit_dtypes.add(logits.dtype)
        self.autocast_in_loss.add(torch.is_autocast_enabled("cpu"))
        return super().__call__(logits, mb, tokens, seqs)


def _worker(cfg: dict[str, Any], cls: type = PolicyWorker) -> Any:
    return cls(rank=0, world_size=1, policy_cfg=cfg, vocab_size=VOCAB, pad_id=0, eos_id=2, seed=3)


# --- the keys -----------------------------------------------------------------------------
def test_precision_names_and_the_dtype_alias() -> None:
    assert resolve_precision({}).name == "32-true"
    assert resolve_precision({"dtype": "float32"}).name == "32-true"
    assert resolve_precision({"dtype": "bfloat16"}).name == "bf16-true"
    assert resolve_precision({"precision": "bf16-mixed", "dtype": None}).name == "bf16-mixed"
    assert resolve_precision({"precision": "bf16-true", "dtype": "bfloat16"}).name == "bf16-true"  # agreeing
    assert Precision("bf16-mixed").param_dtype == torch.float32
    assert Precision("bf16-true").param_dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"policy\.precision=bf16-mixed and policy\.dtype=bfloat16 .*disagree"):
        resolve_precision({"precision": "bf16-mixed", "dtype": "bfloat16"})
    legal = r"\['32-true', 'bf16-mixed', 'bf16-true'\]"
    with pytest.raises(ValueError, match=r"policy\.precision: got '16-mixed'; legal values: " + legal):
        resolve_precision({"precision": "16-mixed"})
    with pytest.raises(ValueError, match=r"policy\.dtype: got 'float16'"):
        resolve_precision({"dtype": "float16"})


def test_the_schemas_refuse_conflicting_keys() -> None:
    with pytest.raises(ValueError, match=r"policy\.precision=32-true and policy\.dtype=bfloat16"):
        HFPolicyConfig(model_name_or_path="x", precision="32-true", dtype="bfloat16")
    with pytest.raises(ValueError, match=r"policy\.precision: got 'fp8'"):
        TinyPolicyConfig(precision="fp8")
    HFPolicyConfig(model_name_or_path="x", dtype="bfloat16")  # the alias alone still works


def test_a_host_without_bfloat16_gets_a_warning_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision_mod, "_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    no_bf16 = r"policy\.precision=bf16-mixed: the CPU has neither avx512_bf16 nor amx_bf16"
    with pytest.warns(RuntimeWarning, match=no_bf16):
        validate_policy(_tiny(precision="bf16-mixed"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_no_bf16(Precision("32-true"), "cpu")  # float32 needs nothing
    monkeypatch.setattr(precision_mod, "_cpu_flags", lambda: frozenset({"amx_bf16", "avx512_bf16"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_no_bf16(Precision("bf16-mixed"), "cpu")


# --- the workers --------------------------------------------------------------------------
def test_bf16_mixed_keeps_float32_master_weights_and_optimizer_state() -> None:
    w = _worker(_tiny(precision="bf16-mixed"))
    rec = _Recorder(w.model)
    probe = _LossProbe()
    out = w.train(_batch(), probe)["per_step"][0]
    assert out["grad_norm"] > 0 and w.optimizer_steps == 1
    assert {p.dtype for p in w.model.parameters()} == {torch.float32}
    states = [s for s in w.optimizer.state.values()]
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)
    assert rec.autocast and all(rec.autocast) and rec.out_dtypes == {torch.bfloat16}  # bf16 matmuls
    assert probe.logit_dtypes == {torch.bfloat16} and probe.autocast_in_loss == {False}  # loss in float32

    rec.clear()
    lp = w.get_logprobs(_batch())["logprobs"]
    assert lp.dtype == torch.float32 and all(rec.autocast) and rec.out_dtypes == {torch.bfloat16}
    rec.clear()
    g = w.generate({"prompts": [[1, 5, 6], [1, 7]], "seeds": [1, 2]}, False)
    assert g["generation_logprobs"].dtype == torch.float32 and rec.autocast and all(rec.autocast)


def test_32_true_runs_without_autocast_and_bf16_true_holds_bfloat16_weights() -> None:
    w = _worker(_tiny(precision="32-true"))
    rec = _Recorder(w.model)
    probe = _LossProbe()
    w.train(_batch(), probe)
    assert not any(rec.autocast) and rec.out_dtypes == {torch.float32} and probe.logit_dtypes == {torch.float32}
    w16 = _worker(_tiny(precision="bf16-true"))
    assert {p.dtype for p in w16.model.parameters()} == {torch.bfloat16}
    w16.train(_batch(), NLLLoss())
    assert {p.dtype for p in w16.model.parameters()} == {torch.bfloat16}
    assert w16.get_logprobs(_batch())["logprobs"].dtype == torch.float32


def test_the_log_softmax_sees_float32_logits_under_mixed_precision() -> None:
    from nemo_dp.models import token_ops

    seen: list[torch.dtype] = []
    original = torch.nn.functional.log_softmax

    def spy(x: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        seen.append(x.dtype)
        return original(x, *a, **k)

    w = _worker(_tiny(precision="bf16-mixed"))
    token_ops.F.log_softmax, saved = spy, token_ops.F.log_softmax  # type: ignore[assignment]
    try:
        w.train(_batch(), NLLLoss())
        w.get_logprobs(_batch())
    finally:
        token_ops.F.log_softmax = saved  # type: ignore[assignment]
    assert seen and set(seen) == {torch.float32}


def test_the_value_worker_follows_the_precision() -> None:
    from nemo_dp.algorithms.ppo_losses import ClippedValueLossFn

    w = _worker(_tiny(precision="bf16-mixed"), ValueWorker)
    rec = _Recorder(w.model)
    values = w.get_values(_batch())["values"]
    assert values.dtype == torch.float32 and all(rec.autocast) and rec.autocast
    w.train(_batch(), ClippedValueLossFn(value_clip=0.2))
    assert {p.dtype for p in w.model.parameters()} == {torch.float32}


def test_an_hf_model_trains_in_bf16_mixed(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from nemo_dp.models.builders import build_tokenizer
    from nemo_dp.models.hf.make_tiny import ensure_tiny_checkpoint

    llama = ensure_tiny_checkpoint("llama", tmp_path)
    cfg = _tiny(kind="hf", model_name_or_path=str(llama), tokenizer_name_or_path=None, precision="bf16-mixed",
                dtype=None, attn_implementation="sdpa", trust_remote_code=False, device="cpu",
                model={"max_seq_len": 64})
    tok = build_tokenizer(cfg)
    w = PolicyWorker(rank=0, world_size=1, policy_cfg=cfg, vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                     eos_id=tok.eos_id, seed=0)
    rec = _Recorder(w.model)
    g = w.generate({"prompts": [tok.encode_prompt("1+2="), tok.encode_prompt("3+4=")], "seeds": [1, 2]}, False)
    assert rec.autocast and all(rec.autocast) and torch.bfloat16 in rec.out_dtypes
    data = BatchedDataDict({"input_ids": g["input_ids"].repeat(2, 1), "input_lengths": g["input_lengths"].repeat(2),
                            "token_mask": g["token_mask"].repeat(2, 1), "sample_mask": torch.ones(4)})
    probe = _LossProbe()
    out = w.train(data, probe)["per_step"][0]
    assert out["grad_norm"] > 0 and probe.logit_dtypes == {torch.bfloat16} and probe.autocast_in_loss == {False}
    assert {p.dtype for p in w.model.parameters()} == {torch.float32}
