"""One contract for every model builder (``tests/contract_suite.py`` does this for adapters).

A concrete test module subclasses :class:`ModelContract` and provides the ``spec`` fixture (a
:class:`ModelSpec`: the ``policy`` node plus the tokenizer and model built from it through
``nemo_dp.models.builders``).  Every check compares behaviour: logits and hidden-state shapes,
cached prefill/decode against the full forward, a save -> load round trip, and generation
log-probs against the training forward's log-probs, so a builder that breaks any seam fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from nemo_dp.models.builders import load_pretrained_model
from nemo_dp.models.generation import generate
from nemo_dp.models.protocol import CausalLM, Tokenizer
from nemo_dp.models.token_ops import token_logprobs_from_logits

#: Bound of the float32 agreement checks (the issue's 1e-5 for generation vs training).
ATOL = 1e-5


@dataclass
class ModelSpec:
    """What a contract test runs on.

    Attributes:
        name: Parametrisation id.
        policy_cfg: The ``policy`` node the model and tokenizer were built from.
        tokenizer: The built tokenizer.
        model: The built model (float32, CPU).
    """

    name: str
    policy_cfg: Any
    tokenizer: Tokenizer
    model: CausalLM


def _prompts(tok: Tokenizer) -> list[list[int]]:
    texts = ["3+4=", "12*7=", "905-77=", "1+1="]
    prompts = [tok.encode_prompt(t) for t in texts]
    prompts[3] = prompts[3][:2]  # rows of different lengths exercise left padding
    return prompts


def _right_padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


class ModelContract:
    """The checks every ``CausalLM`` + ``Tokenizer`` pair must pass."""

    def test_protocols_and_shapes(self, spec: ModelSpec) -> None:
        model, tok = spec.model, spec.tokenizer
        assert isinstance(model, CausalLM) and isinstance(tok, Tokenizer)
        ids = _right_padded(_prompts(tok), tok.pad_id)
        logits = model(ids)
        assert logits.shape == (*ids.shape, model.vocab_size)
        assert model.vocab_size >= tok.vocab_size
        hidden = model.hidden_states(ids)
        assert hidden.shape == (*ids.shape, model.hidden_size)
        assert model.max_positions >= ids.shape[1]

    def test_right_padding_does_not_change_valid_positions(self, spec: ModelSpec) -> None:
        model, tok = spec.model.eval(), spec.tokenizer
        row = _prompts(tok)[2]
        alone = model(torch.tensor([row]))
        padded = model(torch.tensor([row + [tok.pad_id] * 3]))
        torch.testing.assert_close(padded[:, : len(row)], alone, rtol=0, atol=ATOL)

    @torch.no_grad()
    def test_cached_decode_matches_full_forward(self, spec: ModelSpec) -> None:
        model, tok = spec.model.eval(), spec.tokenizer
        prompts = _prompts(tok)
        steps = 4
        cont = [[(7 * i + 3 * t) % tok.vocab_size for t in range(steps)] for i in range(len(prompts))]
        width = max(len(p) for p in prompts)
        bsz = len(prompts)
        left = torch.full((bsz, width), tok.pad_id, dtype=torch.long)
        valid = torch.zeros((bsz, width + steps), dtype=torch.bool)
        for i, p in enumerate(prompts):
            left[i, width - len(p) :] = torch.tensor(p)
            valid[i, width - len(p) :] = True
        offsets = torch.tensor([width - len(p) for p in prompts])
        pos = (torch.arange(width).unsqueeze(0) - offsets.unsqueeze(1)).clamp(min=0)
        step_logits = []
        logits, cache = model.prefill(left, valid[:, :width], pos, width + steps)
        step_logits.append(logits)
        for t in range(steps - 1):
            tokens = torch.tensor([[c[t]] for c in cont])
            plen = torch.tensor([[len(p) + t] for p in prompts])
            valid[:, width + t] = True
            logits, cache = model.decode(tokens, plen, valid[:, : width + t + 1], cache)
            step_logits.append(logits)
        full = model(_right_padded([p + c for p, c in zip(prompts, cont)], tok.pad_id))
        for i, p in enumerate(prompts):
            for t, got in enumerate(step_logits):
                torch.testing.assert_close(got[i], full[i, len(p) - 1 + t], rtol=0, atol=ATOL)

    def test_save_then_load_is_identical(self, spec: ModelSpec, tmp_path: Any) -> None:
        model, tok = spec.model.eval(), spec.tokenizer
        with torch.no_grad():  # move off the initial weights so the round trip is not vacuous
            for p in model.parameters():
                p.add_(0.01)
        model.save_pretrained(tmp_path / "saved")
        loaded = load_pretrained_model(spec.policy_cfg, str(tmp_path / "saved")).eval()
        ids = _right_padded(_prompts(tok), tok.pad_id)
        assert torch.equal(loaded(ids), model(ids))
        mine, theirs = model.state_dict(), loaded.state_dict()
        assert sorted(mine) == sorted(theirs)
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)

    def test_generation_logprobs_match_training_logprobs(self, spec: ModelSpec) -> None:
        model, tok = spec.model, spec.tokenizer
        prompts = _prompts(tok)
        kw = dict(max_new_tokens=6, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=False, temperature=1.0)
        out = generate(model, prompts, seeds=[5, 6, 7, 8], **kw)
        ids = out["input_ids"]
        with torch.no_grad():
            ref = token_logprobs_from_logits(model.eval()(ids), ids)
        diff = (out["generation_logprobs"] - ref * out["token_mask"]).abs().max()
        assert float(diff) <= ATOL
        again = generate(model, prompts, seeds=[5, 6, 7, 8], **kw)
        assert torch.equal(again["input_ids"], ids)
        single = generate(model, [prompts[2]], seeds=[7], **kw)
        n = int(single["input_lengths"][0])
        assert single["input_ids"][0, :n].tolist() == ids[2, :n].tolist()

    def test_rows_stop_at_eos(self, spec: ModelSpec) -> None:
        model, tok = spec.model, spec.tokenizer
        head = model.lm_head_only_parameters() or [model.hf.get_output_embeddings().weight]  # type: ignore[attr-defined]
        with torch.no_grad():  # make eos the likeliest next token after every prefix
            hidden = model.hidden_states(torch.tensor([_prompts(tok)[0]]))
            head[0][tok.eos_id] = hidden[0, -1] / hidden[0, -1].norm() * 50.0
        out = generate(model, _prompts(tok), max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id,
                       greedy=True, temperature=1.0, seeds=[0, 1, 2, 3])
        plens, lengths = out["prompt_lengths"], out["input_lengths"]
        for i in range(len(plens)):
            response = out["input_ids"][i, int(plens[i]) : int(lengths[i])].tolist()
            if not bool(out["truncated"][i]):
                assert response[-1] == tok.eos_id and tok.eos_id not in response[:-1]
        assert not bool(out["truncated"][0])  # the row the head was aimed at stopped


@pytest.fixture
def spec() -> ModelSpec:  # pragma: no cover - overridden by the concrete test module
    raise NotImplementedError
