"""``bench=peer_trl`` without training: the FLOP model, the CPU-flag parsing, the summary of
measured steps, the table and the target checks on constructed numbers, the config checks,
the nemo_dp training config it composes, and that importing the bench never imports TRL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_dp.bench.flops import ModelShape, cpu_info, phase_flops
from nemo_dp.bench.peer_report import format_peer_table, peer_table, target_checks
from nemo_dp.bench.peer_trl import (
    PeerTrlBenchConfig,
    _nemo_logprob_forwards,
    nemo_train_overrides,
    summarize_side,
)
from nemo_dp.bench.trl_side import math_reward

REPO = Path(__file__).resolve().parents[2]

SMOLLM2_CONFIG = {
    "num_hidden_layers": 30,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
}


def test_smollm2_shape_counts_its_135m_matmul_weights() -> None:
    shape = ModelShape.from_hf_config(SMOLLM2_CONFIG)
    # per layer: q and o 576x576, k and v 576x192, gate/up/down 576x1536
    assert shape.body_params == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) == 106_168_320
    assert shape.head_params == 576 * 49152
    assert shape.kv_heads == 3 and shape.head_dim == 64
    with pytest.raises(KeyError, match="intermediate_size"):
        ModelShape.from_hf_config({k: v for k, v in SMOLLM2_CONFIG.items() if k != "intermediate_size"})


def test_head_dim_and_kv_heads_default_like_llama() -> None:
    cfg = {k: v for k, v in SMOLLM2_CONFIG.items() if k not in ("head_dim", "num_key_value_heads")}
    shape = ModelShape.from_hf_config(cfg)
    assert shape.head_dim == 64 and shape.kv_heads == 9


def test_forward_flops_by_hand() -> None:
    # 1 layer, hidden 2, 1 head of 2, MLP 3, vocab 5
    shape = ModelShape(layers=1, hidden=2, intermediate=3, heads=1, kv_heads=1, head_dim=2, vocab=5)
    assert shape.body_params == 4 + 8 + 4 + 18
    # 3 tokens, 2 scored: weights 2*34*3, attention 4*1*1*2*(1+2+3), head 2*10*2
    assert shape.forward_flops(3, 2) == 2 * 34 * 3 + 4 * 2 * 6 + 2 * 10 * 2


def test_phase_flops_split() -> None:
    shape = ModelShape.from_hf_config(SMOLLM2_CONFIG)
    one = shape.forward_flops(46, 12)
    flops = phase_flops(shape, samples=64, prompt_len=34, response_len=12, logprob_forwards=2)
    assert flops.train == pytest.approx(64 * 3 * one)
    assert flops.logprobs == pytest.approx(64 * 2 * one)
    assert flops.generation == pytest.approx(64 * shape.forward_flops(45, 12))
    # about 6 x 135M FLOPs per trained token
    assert flops.train / (64 * 46) == pytest.approx(6 * (shape.body_params + shape.head_params * 12 / 46), rel=0.02)
    assert phase_flops(shape, samples=1, prompt_len=3, response_len=1, logprob_forwards=0).logprobs == 0
    with pytest.raises(ValueError, match="response_len >= 1"):
        phase_flops(shape, samples=1, prompt_len=3, response_len=0, logprob_forwards=1)
    with pytest.raises(ValueError, match="logprob_forwards"):
        phase_flops(shape, samples=1, prompt_len=3, response_len=1, logprob_forwards=-1)


def test_cpu_info_reads_the_first_flags_line() -> None:
    text = "model name\t: Some CPU\nflags\t\t: fpu avx2 avx512f amx_bf16\n\nmodel name\t: x\nflags\t: sse\n"
    info = cpu_info(text)
    assert info["model"] == "Some CPU"
    assert info["flags"]["avx2"] and info["flags"]["amx_bf16"] and info["flags"]["avx512f"]
    assert not info["flags"]["avx512_bf16"] and not info["flags"]["amx_tile"]
    assert cpu_info("")["model"] == "unknown"


def _rows(steps: int, step_s: float, gen: float = 1.0) -> list[dict]:
    return [
        {"step": s, "step_time_s": step_s * (5 if s == 1 else 1), "time/generation_s": gen, "time/logprobs_s": 0.5,
         "time/train_s": 2.0, "reward_mean": 0.1 * s, "mean_response_length": 12.0}
        for s in range(1, steps + 1)
    ]


def _bench(**kw) -> PeerTrlBenchConfig:
    kw.setdefault("warmup_steps", 1)  # the cases below are written for one warm-up step
    return PeerTrlBenchConfig(**kw)


def test_summary_excludes_the_warmup_steps_and_counts_flops() -> None:
    bench = _bench()  # warmup 1, measured 3, 64 samples
    shape = ModelShape.from_hf_config(SMOLLM2_CONFIG)
    s = summarize_side(_rows(5, 4.0), bench, shape=shape, prompt_len=34.0, logprob_forwards=1)
    assert s["step_s"] == 4.0 and s["samples_per_s"] == 16.0
    assert s["rewards"] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert s["other_s"] == pytest.approx(0.5)
    flops = phase_flops(shape, samples=64, prompt_len=34.0, response_len=12.0, logprob_forwards=1)
    assert s["train_gflops"] == pytest.approx(flops.train / 1e9 / 2.0)
    assert s["logprobs_gflop"] == pytest.approx(flops.logprobs / 1e9)
    # One slow measured step moves the mean, not the median: "other" is the mean step less
    # the mean phases, so it never goes negative when the phases were slow with it.
    rows = _rows(5, 4.0)
    rows[2].update({"step_time_s": 7.0, "time/train_s": 5.0})
    slow = summarize_side(rows, bench, shape=shape, prompt_len=34.0, logprob_forwards=1)
    assert slow["step_s"] == 4.0 and slow["train_s"] == pytest.approx(3.0)
    assert slow["other_s"] == pytest.approx(5.0 - 4.5)
    with pytest.raises(RuntimeError, match="measured 1 steps, expected bench.measured_steps=3"):
        summarize_side(_rows(2, 4.0), bench, shape=shape, prompt_len=34.0, logprob_forwards=1)


def _sides() -> dict:
    bench = _bench()
    shape = ModelShape.from_hf_config(SMOLLM2_CONFIG)
    out = {}
    for side, precision, step_s in (("nemo_dp", "32-true", 10.0), ("trl", "32-true", 20.0),
                                    ("nemo_dp", "bf16-mixed", 4.0), ("trl", "bf16-mixed", 5.0),
                                    ("nemo_dp[tq]", "bf16-mixed", 4.2)):
        s = summarize_side(_rows(4, step_s), bench, shape=shape, prompt_len=34.0, logprob_forwards=1)
        out[f"{side}|{precision}"] = {"side": side, "precision": precision, **s}
    return out


def test_table_ratios_and_peak_fractions() -> None:
    sides = _sides()
    peaks = {"float32_budget": 100.0, "bfloat16_budget": 400.0}
    rows = {(r["side"], r["precision"]): r for r in peer_table(sides, peaks)}
    assert rows[("nemo_dp", "32-true")]["vs_trl"] == pytest.approx(2.0)
    assert rows[("nemo_dp", "bf16-mixed")]["vs_trl"] == pytest.approx(1.25)
    assert rows[("trl", "32-true")]["vs_trl"] == pytest.approx(1.0)
    r = rows[("nemo_dp", "32-true")]
    assert r["train_of_peak"] == pytest.approx(r["train_gflops"] / 100.0)
    assert rows[("nemo_dp", "bf16-mixed")]["train_of_peak"] == pytest.approx(
        rows[("nemo_dp", "bf16-mixed")]["train_gflops"] / 400.0
    )
    text = format_peer_table(list(rows.values()))
    assert "nemo_dp[tq]" in text and "x TRL" in text and text.count("\n") == len(rows)


def test_targets_are_checked_from_the_measured_numbers() -> None:
    sides = _sides()
    host = {"cpu": {"flags": {"amx_bf16": True}}, "matmul_gflops": {"float32_budget": 1e9}}
    checks = {c["target"]: c for c in target_checks(sides, host)}
    assert checks["nemo_dp / TRL samples per s, 32-true"]["met"] is True  # 2.0 >= 1.6
    assert checks["nemo_dp / TRL samples per s, bf16-mixed"]["met"] is False  # 1.25
    assert checks["nemo_dp bf16-mixed / 32-true samples per s"]["value"] == pytest.approx(2.5)
    assert checks["nemo_dp bf16-mixed / 32-true samples per s"]["met"] is False
    assert checks["nemo_dp 32-true train phase / host float32 matmul peak"]["met"] is False
    tq = checks["nemo_dp[tq] / legacy step time, bf16-mixed"]
    assert tq["value"] == pytest.approx(1.05) and tq["met"] is False
    only_trl = {k: v for k, v in sides.items() if v["side"] == "trl"}
    assert all(c["met"] is None for c in target_checks(only_trl, host))


def test_config_checks_name_the_key() -> None:
    with pytest.raises(ValueError, match="bench.precisions"):
        _bench(precisions=["fp16"])
    with pytest.raises(ValueError, match="bench.warmup_steps"):
        _bench(warmup_steps=0)
    with pytest.raises(ValueError, match="bench.nemo_dp_size"):
        _bench(cores=3, nemo_dp_size=2)
    with pytest.raises(ValueError, match="bench.group_size"):
        _bench(group_size=1)
    with pytest.raises(ValueError, match="bench.data_planes"):
        _bench(data_planes=["local"])
    assert _bench().samples_per_step == 64


def test_logprob_forwards_follow_the_step_metrics() -> None:
    assert _nemo_logprob_forwards({}, 0.04) == 2
    assert _nemo_logprob_forwards({"prev_logprobs_source": "separate_forward"}, 0.04) == 2
    assert _nemo_logprob_forwards({"prev_logprobs_source": "train_forward"}, 0.04) == 1
    assert _nemo_logprob_forwards({"prev_logprobs_source": "train_forward"}, 0.0) == 0


def test_the_nemo_side_composes_a_valid_config_with_the_shared_settings() -> None:
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import register_configs, validate_config

    register_configs(REPO / "recipes")
    bench = OmegaConf.to_object(OmegaConf.structured(PeerTrlBenchConfig))
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        for precision in bench.precisions:
            cfg = compose("config", overrides=["policy=smollm2", *nemo_train_overrides(bench, precision, "tq")])
            validate_config(cfg)
            assert cfg.policy.precision == precision
            assert cfg.policy.dp_size * cfg.policy.torch_threads == bench.cores
            assert cfg.policy.train_global_batch_size == bench.samples_per_step  # one optimizer step per rollout
            # one training pass per rank, as TRL trains its one batch in one pass
            assert cfg.policy.train_micro_batch_size * cfg.policy.dp_size == bench.samples_per_step
            assert cfg.algorithm.loss.reference_policy_kl_penalty == bench.kl_coef
            assert cfg.algorithm.loss.token_level_loss is True
            assert cfg.env.format == "chat" and cfg.env.reward == "math"
            assert cfg.algorithm.max_steps == bench.warmup_steps + bench.measured_steps + 1


def test_the_reward_is_nemo_dps_math_reward_on_trl_completions() -> None:
    completions = [[{"role": "assistant", "content": "3 + 4 = 7."}], [{"role": "assistant", "content": "It is 8"}], "7"]
    assert math_reward(completions, ["7", "7", "7"]) == [1.0, 0.0, 1.0]


def test_importing_the_bench_does_not_import_trl_or_datasets() -> None:
    code = (
        "import sys, nemo_dp.bench, nemo_dp.bench.peer_trl, nemo_dp.bench.trl_side; "
        "bad = [m for m in ('trl', 'datasets') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
