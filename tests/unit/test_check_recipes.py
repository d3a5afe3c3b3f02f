"""The recipe-claim parser and checker of ``scripts/check_recipes.py``.

These tests isolate the parser and the checker: runs are represented by fake ``summary.json``
dicts and ``RunResult`` values (no launcher, no Ray), so they say nothing about whether a recipe
really achieves its claim - that is what running the script does.  The one test that reads the
real recipe files checks that every recipe has a header claim the grammar accepts.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("check_recipes", REPO / "scripts" / "check_recipes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_recipes"] = module
    spec.loader.exec_module(module)
    return module


cr = _load_script()


def _summary(warm: float | None, final: float, *, final_phase: str = "grpo") -> dict:
    phases = {final_phase: {"val_accuracy": final, "step": 40}}
    summary = {"status": "completed", "final_phase": final_phase, "phases": phases, "wall_time_s": 100.0}
    if warm is not None:
        phases["warm_start"] = {"val_accuracy": warm, "step": 225}
        summary["accuracy_gain"] = final - warm
    return summary


def _result(summary: dict, *, wall: float = 100.0, seed: int = 42, recipe: str = "r") -> object:
    return cr.RunResult(recipe, seed, wall, metrics=cr.metrics_from_summary(summary))


def test_parse_full_claim() -> None:
    claim = cr.parse_claim(
        " val_accuracy_gain >= 0.10 on seeds 42,1, 2;  wall <= 300 s", recipe="r", where="r.yaml:3"
    )
    assert claim.conditions == (cr.Condition("val_accuracy_gain", ">=", 0.10),)
    assert claim.seeds == (42, 1, 2)
    assert claim.wall_s == 300.0
    assert claim.text == "val_accuracy_gain >= 0.10 on seeds 42,1, 2; wall <= 300 s"


def test_parse_several_conditions_without_seeds() -> None:
    claim = cr.parse_claim("val_accuracy >= 0.9; warm_start_val_accuracy < 0.5", recipe="r", where="w")
    assert [c.text() for c in claim.conditions] == ["val_accuracy >= 0.9", "warm_start_val_accuracy < 0.5"]
    assert claim.seeds is None and claim.wall_s is None
    assert claim.covers(42, default_seed=42) and not claim.covers(1, default_seed=42)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("accuracy >= 0.1", "unknown metric 'accuracy'"),
        ("val_accuracy => 0.1", "cannot parse clause 'val_accuracy => 0.1'"),
        ("val_accuracy >= 0.1 on seeds 1,x", "seeds must be comma-separated integers"),
        ("val_accuracy >= 0.1 on seeds 1,1", "seed listed twice"),
        ("val_accuracy >= 0.1 on seeds 1; val_accuracy_gain > 0 on seeds 2", "'on seeds' given twice"),
        ("wall <= 300 s", "has no metric clause"),
        ("val_accuracy >= 0.1; wall <= 3 s; wall <= 4 s", "'wall' given twice"),
        ("val_accuracy >= 0.1; wall <= 0 s", "wall bound must be > 0 s"),
        ("val_accuracy >= 0.1;", "empty clause"),
        ("val_accuracy >= 0.1; wall < 300", "clause 'wall < 300'; expected 'wall <= <number> s'"),
    ],
)
def test_parse_errors_name_the_place_and_the_clause(text: str, fragment: str) -> None:
    with pytest.raises(cr.ClaimError) as err:
        cr.parse_claim(text, recipe="r", where="recipes/r.yaml:7")
    assert str(err.value).startswith("recipes/r.yaml:7: ")
    assert fragment in str(err.value)


def test_recipe_file_claims_only_in_header(tmp_path: Path) -> None:
    ok = tmp_path / "ok.yaml"
    ok.write_text(
        "# python launchers/launch.py recipe=ok\n# claim: val_accuracy >= 0.9\n"
        "#\n# claim: val_accuracy_gain > 0 on seeds 1,2; wall <= 60 s\nalgorithm:\n  max_steps: 3\n"
    )
    claims = cr.parse_recipe_claims(ok)
    assert [c.where for c in claims] == [f"{ok}:2", f"{ok}:4"]
    assert cr.seeds_to_run(claims, 42, all_claimed=True) == [42, 1, 2]
    assert cr.seeds_to_run(claims, 42, all_claimed=False) == [42]

    late = tmp_path / "late.yaml"
    late.write_text("# header\nalgorithm:\n  max_steps: 3\n# claim: val_accuracy >= 0.9\n")
    with pytest.raises(cr.ClaimError, match=rf"{late}:4: claims belong in the leading comment block"):
        cr.parse_recipe_claims(late)

    none = tmp_path / "none.yaml"
    none.write_text("# header only\nalgorithm:\n  max_steps: 3\n")
    with pytest.raises(cr.ClaimError, match=rf"{none}: no '# claim:' line"):
        cr.parse_recipe_claims(none)


def test_every_recipe_has_a_parsable_claim() -> None:
    paths = cr.select_recipes(None)
    assert [p.stem for p in paths] == sorted(p.stem for p in (REPO / "recipes").glob("*.yaml"))
    for path in paths:
        claims = cr.parse_recipe_claims(path)
        assert claims, path
        assert all(c.wall_s is not None for c in claims), f"{path}: every claim bounds the wall time"
        assert cr.default_seed(path) == 42


def test_checker_passes_and_fails_at_the_threshold() -> None:
    claim = cr.parse_claim("val_accuracy_gain >= 0.10 on seeds 42,1,2; wall <= 300 s", recipe="r", where="w")
    assert cr.check_claim(claim, _result(_summary(0.25, 0.35))).passed  # gain exactly 0.10 (float-safe)
    low = cr.check_claim(claim, _result(_summary(0.25, 0.30)))
    assert not low.passed
    assert low.failures == ["val_accuracy_gain = 0.050, claimed >= 0.1"]
    slow = cr.check_claim(claim, _result(_summary(0.2, 0.5), wall=301.0))
    assert not slow.passed and slow.failures == ["wall 301 s, claimed <= 300 s"]
    drop = cr.check_claim(claim, _result(_summary(0.195, 0.090), wall=400.0))
    assert len(drop.failures) == 2
    strict = cr.parse_claim("val_accuracy > 0.35; warm_start_val_accuracy < 0.25", recipe="r", where="w")
    assert cr.check_claim(strict, _result(_summary(0.25, 0.35))).failures == [
        "val_accuracy = 0.350, claimed > 0.35",
        "warm_start_val_accuracy = 0.250, claimed < 0.25",
    ]


def test_missing_metric_and_failed_run_fail() -> None:
    claim = cr.parse_claim("val_accuracy_gain > 0; val_accuracy >= 0.9", recipe="r", where="w")
    sft = _result(_summary(None, 0.95, final_phase="sft"))
    verdict = cr.check_claim(claim, sft)
    assert not verdict.passed and verdict.failures == ["val_accuracy_gain not recorded by the run"]
    crashed = cr.RunResult("r", 42, 5.0, error="launcher exited 1 (log: x.log)")
    assert cr.check_claim(claim, crashed).failures == ["run failed: launcher exited 1 (log: x.log)"]


def test_metrics_from_summary() -> None:
    assert cr.metrics_from_summary(_summary(0.482, 0.663)) == pytest.approx(
        {"val_accuracy": 0.663, "warm_start_val_accuracy": 0.482, "val_accuracy_gain": 0.181}
    )
    assert cr.metrics_from_summary(_summary(None, 0.9, final_phase="sft")) == {"val_accuracy": 0.9}


def test_a_phase_validated_at_start_claims_its_own_gain() -> None:
    summary = _summary(None, 0.6)
    summary["phases"]["grpo"]["initial_val_accuracy"] = 0.35
    assert cr.metrics_from_summary(summary) == pytest.approx(
        {"val_accuracy": 0.6, "initial_val_accuracy": 0.35, "main_phase_val_accuracy_gain": 0.25}
    )
    claim = cr.parse_claim("main_phase_val_accuracy_gain >= 0.20; wall <= 600 s", recipe="r", where="w")
    assert cr.check_claim(claim, _result(summary)).passed
    summary["phases"]["grpo"]["initial_val_accuracy"] = 0.45
    assert not cr.check_claim(claim, _result(summary)).passed


def test_table_has_one_row_per_run_and_covering_claim() -> None:
    gain = "val_accuracy_gain >= 0.1 on seeds 42,1; wall <= 300 s"
    final = "val_accuracy >= 0.9 on seeds 1; wall <= 300 s"
    claims = {"a": [cr.parse_claim(gain, recipe="a", where="w"), cr.parse_claim(final, recipe="a", where="w")]}
    results = [
        _result(_summary(0.4, 0.6), seed=42, recipe="a"),
        _result(_summary(0.4, 0.45), seed=1, recipe="a", wall=120.4),
    ]
    rows = cr.table_rows(results, claims, {"a": 42})
    assert rows == [
        ["a", "42", "0.400", "0.600", "+0.200", "100 s", gain, "PASS"],
        ["a", "1", "0.400", "0.450", "+0.050", "120 s", gain, "FAIL: val_accuracy_gain = 0.050, claimed >= 0.1"],
        ["a", "1", "0.400", "0.450", "+0.050", "120 s", final, "FAIL: val_accuracy = 0.450, claimed >= 0.9"],
    ]
    md = cr.markdown_table(rows).splitlines()
    assert md[0] == "| recipe | seed | warm-start acc | final acc | gain | wall | claim | result |"
    assert md[1] == "|---|---|---|---|---|---|---|---|"
    assert len(md) == 2 + len(rows)


def test_launch_command_and_recipe_selection() -> None:
    run_dir = Path("/tmp/x/grpo_arith_seed1")
    cmd = cr.launch_command("grpo_arith", 1, run_dir, ["data_plane.timeouts.startup_s=300"])
    assert cmd[1:] == [
        str(REPO / "launchers" / "launch.py"),
        "recipe=grpo_arith",
        "seed=1",
        "hydra.run.dir=/tmp/x/grpo_arith_seed1",
        "logger.progress_bar=false",
        "data_plane.timeouts.startup_s=300",
    ]
    assert [p.stem for p in cr.select_recipes("sft_arith,grpo_arith")] == ["sft_arith", "grpo_arith"]
    with pytest.raises(cr.ClaimError, match="unknown recipe"):
        cr.select_recipes("grpo_arith,nope")


def test_recheck_reads_an_earlier_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "r_seed1"
    assert cr.recheck_run("r", 1, run_dir).error == f"not run yet: no {tmp_path / 'r_seed1.wall.json'}"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps(_summary(0.4, 0.6)))
    (tmp_path / "r_seed1.wall.json").write_text('{"wall_s": 12.5, "error": null}')
    res = cr.recheck_run("r", 1, run_dir)
    assert (res.error, res.wall_s) == (None, 12.5)
    expected = {"val_accuracy": 0.6, "warm_start_val_accuracy": 0.4, "val_accuracy_gain": 0.2}
    assert res.metrics == pytest.approx(expected)
    (tmp_path / "r_seed1.wall.json").write_text('{"wall_s": 3.0, "error": "launcher exited 1 (log: l)"}')
    assert cr.recheck_run("r", 1, run_dir).error == "launcher exited 1 (log: l)"
