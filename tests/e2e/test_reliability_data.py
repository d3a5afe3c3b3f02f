"""Issue 14 end to end, the rest: dataset errors that surface before Ray, and a training
``--help`` / tab completion that offers only what the training launcher can run.

Dataset cases drive ``launchers/launch.py`` in a subprocess: an out-of-vocabulary character in
the SFT or RL jsonl names the file:line, the field and the character; a dataset smaller than
one batch names the batch-size key.  Each must be a clean configuration failure: Hydra's error
exit, the message on stderr, no traceback, no run directory left behind, and no Ray started
(the run's private Ray directory, ``cluster.temp_dir``, which ``init_ray`` creates before it
starts Ray, never appears).  They fail before Ray, so each takes seconds.

Help cases: the bench's configs live in ``conf_bench/`` now, so the training launcher's group
list and completion hold no ``bench`` group and no schema node; the bench launcher still lists
its ``bench`` options (with the shared groups from ``conf/``) through the same parsing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import GRPO_ONE_STEP, LAUNCHER, REPO_ROOT, TINY, run_script

pytestmark = pytest.mark.timeout(240)

BENCH_LAUNCHER = REPO_ROOT / "launchers" / "bench.py"

SFT: tuple[str, ...] = (
    "recipe=sft_arith",
    *TINY,
    "data_plane=disabled",
    "algorithm.max_steps=1",
    "algorithm.val_period=0",
    "logger.progress_bar=false",
)
#: The default data plane (TransferQueue): the dataset check must still run before Ray and TQ.
GRPO = GRPO_ONE_STEP


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env["HYDRA_FULL_ERROR"] = "0"
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_script(Path(argv[0]), argv[1:], cwd, env=env or _env(), timeout=180)


def _jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _refused_before_ray(base: tuple[str, ...], tmp_path: Path, *overrides: str) -> str:
    """Run the launcher; assert a clean failure before Ray; return its stderr."""
    run_dir = tmp_path / "run"
    ray_dir = tmp_path / "ray"
    proc = _run(
        [str(LAUNCHER), *base, *overrides, f"cluster.temp_dir={ray_dir}", f"hydra.run.dir={run_dir}"], tmp_path
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-4000:]  # Hydra's exit status for a reported error
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())
    assert not ray_dir.exists(), "Ray was started before the dataset error"
    assert "run directory:" not in proc.stdout  # the launcher stopped before its run banner
    return proc.stderr


# --- out-of-vocabulary characters --------------------------------------------------------------


def test_sft_jsonl_with_an_unknown_character_names_file_line_field_and_character(tmp_path: Path) -> None:
    data = _jsonl(
        tmp_path / "sft.jsonl",
        [{"prompt": "1+1=", "response": "2"}] * 9 + [{"prompt": "2+2=", "response": "4é"}],
    )
    err = _refused_before_ray(SFT, tmp_path, f"env.sft_jsonl={data}")
    assert (
        f"env.sft_jsonl: {data}:10: field 'response' holds character 'é', which the tokenizer cannot "
        "encode; remove it from the data or use a tokenizer whose vocabulary has it"
    ) in err, err[-3000:]


def test_rl_jsonl_with_an_unknown_character_names_file_line_field_and_character(tmp_path: Path) -> None:
    data = _jsonl(
        tmp_path / "rl.jsonl",
        [{"prompt": "1+1=", "answer": "2"}] * 2 + [{"prompt": "3×3=", "answer": "9"}] + [{"prompt": "1+2=", "answer": "3"}] * 5,
    )
    err = _refused_before_ray(GRPO, tmp_path, f"env.rl_jsonl={data}")
    assert f"env.rl_jsonl: {data}:3: field 'prompt' holds character '×'" in err, err[-3000:]


# --- a dataset smaller than one batch ------------------------------------------------------------


def test_sft_jsonl_smaller_than_the_batch_names_the_batch_size_key(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "sft.jsonl", [{"prompt": "1+1=", "response": "2"}] * 5)
    err = _refused_before_ray(SFT, tmp_path, f"env.sft_jsonl={data}")  # TINY: a batch is 8 rows
    assert (
        f"env.sft_jsonl: {data}: the file holds 5 rows, fewer than policy.train_global_batch_size=8 "
        "(one batch); add rows or lower policy.train_global_batch_size"
    ) in err, err[-3000:]


def test_rl_jsonl_smaller_than_the_batch_names_the_batch_size_key(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "rl.jsonl", [{"prompt": "1+1=", "answer": "2"}] * 3)
    err = _refused_before_ray(GRPO, tmp_path, f"env.rl_jsonl={data}")
    assert (
        f"env.rl_jsonl: {data}: the file holds 3 rows, fewer than algorithm.num_prompts_per_step=4 "
        "(one batch); add rows or lower algorithm.num_prompts_per_step"
    ) in err, err[-3000:]


# --- help and completion -------------------------------------------------------------------------


def _help_groups(help_text: str) -> dict[str, list[str]]:
    """``group -> options`` from the ``== Configuration groups ==`` section of Hydra's help."""
    assert "== Configuration groups ==" in help_text, help_text[:2000]
    section = help_text.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    groups: dict[str, list[str]] = {}
    for line in section.splitlines():
        name, sep, options = line.partition(": ")
        if sep and " " not in name.strip():
            groups[name.strip()] = [o.strip() for o in options.split(",")]
    return groups


def test_training_help_lists_no_bench_group_and_no_schema_options(tmp_path: Path) -> None:
    proc = _run([str(LAUNCHER), "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = _help_groups(proc.stdout)
    assert {"algorithm", "data_plane", "policy", "env", "cluster", "logger", "checkpointing", "recipe"} <= set(groups)
    assert "bench" not in groups, groups
    schemas = [f"{g}={o}" for g, opts in groups.items() for o in [g, *opts] if "_schema" in o]
    assert schemas == [], schemas
    assert set(groups["data_plane"]) == {"disabled", "local", "ray", "tq"}


def test_training_completion_offers_no_bench_group_and_no_schema_options(tmp_path: Path) -> None:
    def complete(line: str) -> list[str]:
        proc = _run([str(LAUNCHER), "-sc", "query=bash"], tmp_path, env={**_env(), "COMP_LINE": line})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.split()

    top = complete("launch.py ")
    assert {"algorithm=", "data_plane=", "policy=", "recipe="} <= set(top), top
    assert "bench=" not in top and "bench." not in top, top
    assert not [t for t in top if "_schema" in t], top
    options = complete("launch.py data_plane=")
    assert set(options) == {"data_plane=disabled", "data_plane=local", "data_plane=ray", "data_plane=tq"}, options


def test_bench_help_lists_its_runnable_benches_and_the_shared_groups(tmp_path: Path) -> None:
    # The same parsing sees a bench group where there is one (so the checks above can fail).
    proc = _run([str(BENCH_LAUNCHER), "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    groups = _help_groups(proc.stdout)
    assert groups["bench"] == ["data_plane", "grpo_memory", "grpo_step", "peer_trl", "ppo_step", "sft_step"], groups
    assert set(groups["data_plane"]) == {"disabled", "local", "ray", "tq"}  # found through conf/ on the search path
    assert not [o for opts in groups.values() for o in opts if "_schema" in o], groups
