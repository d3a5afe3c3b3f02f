"""TinyCausalLM: shapes, causality, padding invariance, seeded init, KV-cache equivalence,
hidden states feeding the LM head, and the safetensors + JSON save/load round trip."""

from __future__ import annotations

import pytest
import torch

from nemo_dp.models.tiny.model import ModelConfig, TinyCausalLM


def _cfg(**kw: int | float) -> ModelConfig:
    base = {"vocab_size": 20, "n_layers": 2, "d_model": 32, "n_heads": 4, "max_seq_len": 16}
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


def test_shapes_and_hidden_states_feed_the_head() -> None:
    ids = torch.randint(0, 20, (3, 7))
    model = TinyCausalLM(_cfg(), seed=0)
    logits = model(ids)
    assert logits.shape == (3, 7, 20)
    hidden = model.hidden_states(ids)
    assert hidden.shape == (3, 7, model.hidden_size) and hidden.dtype == torch.float32
    assert torch.equal(model.head(hidden), logits)
    assert model.max_positions == 16 and model.vocab_size == 20
    assert [p is model.head.weight for p in model.lm_head_only_parameters()] == [True]


def test_save_and_load_round_trip_exactly(tmp_path) -> None:
    model = TinyCausalLM(_cfg(), seed=5)
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    loaded = TinyCausalLM.from_pretrained(tmp_path / "m")
    assert loaded.cfg == model.cfg
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    (tmp_path / "m" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="is not a 'nemo_dp_tiny' config"):
        TinyCausalLM.from_pretrained(tmp_path / "m")


def test_seeded_init_is_deterministic_and_leaves_global_rng() -> None:
    state = torch.get_rng_state()
    a, b, c = TinyCausalLM(_cfg(), seed=1), TinyCausalLM(_cfg(), seed=1), TinyCausalLM(_cfg(), seed=2)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(a(ids), b(ids))
    assert not torch.equal(a(ids), c(ids))
    # nn.Linear's default init consumed global RNG, but seeded weights do not depend on it.
    torch.set_rng_state(state)
    torch.rand(5)
    assert torch.equal(TinyCausalLM(_cfg(), seed=1)(ids), a(ids))


def test_causal_and_right_padding_harmless() -> None:
    model = TinyCausalLM(_cfg(), seed=0)
    ids = torch.randint(3, 20, (2, 10))
    full = model(ids)
    changed = ids.clone()
    changed[:, 6:] = 0  # later tokens (e.g. right padding) do not affect earlier positions
    torch.testing.assert_close(model(changed)[:, :6], full[:, :6])
    assert not torch.allclose(model(changed)[:, 6:], full[:, 6:])


def test_cached_forward_matches_full_forward() -> None:
    model = TinyCausalLM(_cfg(), seed=0).eval()
    ids = torch.randint(3, 20, (2, 9))
    full = model(ids)
    cache = model.new_cache(2, 9)
    pos = torch.arange(9).unsqueeze(0).expand(2, 9)
    mask0 = torch.tril(torch.ones(5, 5, dtype=torch.bool)).expand(2, 1, 5, 5)
    out = [model.forward_cached(ids[:, :5], pos[:, :5], cache, mask0)]
    for t in range(5, 9):
        m = torch.ones(2, 1, 1, t + 1, dtype=torch.bool)
        out.append(model.forward_cached(ids[:, t : t + 1], pos[:, t : t + 1], cache, m))
    torch.testing.assert_close(torch.cat(out, 1), full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="KV cache of 9 positions cannot take 1 more after 9"):
        model.forward_cached(ids[:, :1], pos[:, :1], cache, torch.ones(2, 1, 1, 10, dtype=torch.bool))


def test_config_validation_and_position_limit() -> None:
    with pytest.raises(ValueError, match="d_model \\(30\\) must be divisible by n_heads \\(4\\)"):
        _cfg(d_model=30)
    with pytest.raises(ValueError, match="n_layers must be >= 1"):
        _cfg(n_layers=0)
    with pytest.raises(ValueError, match="exceeds max_seq_len=16"):
        TinyCausalLM(_cfg(), seed=0)(torch.zeros(1, 17, dtype=torch.long))


def test_training_step_reduces_loss() -> None:
    torch.manual_seed(0)
    model = TinyCausalLM(_cfg(), seed=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = torch.randint(3, 20, (4, 8))
    losses = []
    for _ in range(20):
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 20), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
