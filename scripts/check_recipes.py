"""Run every recipe fully and check the claims its header makes (not part of CI).

Why this exists: a recipe's header says what it achieves ("GRPO gains +0.18 held-out accuracy
in about two minutes"), and code changes elsewhere can quietly make that false.  This script
runs each recipe through ``launchers/launch.py`` exactly as a user would, in its own run
directory, reads the run's ``summary.json`` and checks every claim, so the README's table of
what the recipes achieve can be regenerated with one command.

Claim grammar (one claim per line, in the recipe's leading comment block)::

    # claim: <clause> [; <clause>]...
    clause    := <metric> <op> <number> [on seeds <int>[,<int>...]]
               | wall <= <number> s
    metric    := val_accuracy | val_accuracy_gain | warm_start_val_accuracy
               | initial_val_accuracy | main_phase_val_accuracy_gain
    op        := >= | > | <= | <

``val_accuracy`` is the held-out exact-match accuracy after the run's last phase,
``warm_start_val_accuracy`` the one after the SFT warm start, ``val_accuracy_gain`` their
difference (``summary.json``'s ``accuracy_gain``).  ``initial_val_accuracy`` is the last phase's
accuracy before its first step (recorded with ``algorithm.val_at_start=true``) and
``main_phase_val_accuracy_gain`` what that phase added to it, so a recipe without a warm start
(GRPO from pretrained weights) can claim its gain.  ``wall`` bounds the wall-clock seconds of the
whole launcher command (start-up included), measured by this script.  ``on seeds`` may appear
once per line and applies to every clause of the line; a line without it covers the recipe's
default seed (the root config's ``seed``, or the recipe's own ``seed`` key).  Example::

    # claim: val_accuracy_gain >= 0.10 on seeds 42,1,2; wall <= 300 s

Usage::

    python scripts/check_recipes.py [--recipes a,b] [--seeds-from-claims]
        [--work-dir DIR] [--table-out FILE] [--override key=value ...]

Without ``--seeds-from-claims`` each recipe runs once, at the first seed its claims name; with
it, at every seed any of its claims names.  The exit status is non-zero when any claim fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPES_DIR = REPO_ROOT / "recipes"
ROOT_CONFIG = REPO_ROOT / "conf" / "config.yaml"
LAUNCHER = REPO_ROOT / "launchers" / "launch.py"

CLAIM_PREFIX = "# claim:"
METRICS = (
    "val_accuracy",
    "val_accuracy_gain",
    "warm_start_val_accuracy",
    "initial_val_accuracy",
    "main_phase_val_accuracy_gain",
)
# Accuracies are fractions k/n, so a gain of exactly 0.10 can come out as 0.0999...: comparisons
# treat values within _EPS as equal.
_EPS = 1e-9
OPS = {
    ">=": lambda a, b: a >= b - _EPS,
    ">": lambda a, b: a > b + _EPS,
    "<=": lambda a, b: a <= b + _EPS,
    "<": lambda a, b: a < b - _EPS,
}

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_METRIC_RE = re.compile(
    rf"^(?P<metric>[a-z_]+)\s*(?P<op>>=|<=|>|<)\s*(?P<value>{_NUMBER})"
    r"(?:\s+on\s+seeds\s+(?P<seeds>[^;]+?))?$"
)
_WALL_RE = re.compile(rf"^wall\s*<=\s*(?P<value>{_NUMBER})\s*s$")


class ClaimError(ValueError):
    """A recipe's claim line does not follow the grammar (the message names file:line)."""


@dataclass(frozen=True)
class Condition:
    """One ``<metric> <op> <threshold>`` clause of a claim.

    Attributes:
        metric: One of ``METRICS``.
        op: One of ``OPS``.
        threshold: The bound.
    """

    metric: str
    op: str
    threshold: float

    def text(self) -> str:
        """The clause as written in a claim (threshold in its shortest form)."""
        return f"{self.metric} {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class Claim:
    """One ``# claim:`` line of a recipe.

    Attributes:
        recipe: Recipe name (file stem).
        where: ``file:line`` of the claim.
        text: The claim as written (after ``# claim:``).
        conditions: Its metric clauses.
        seeds: The seeds it covers (``None`` = the recipe's default seed).
        wall_s: Bound on the launcher command's wall time in seconds (``None`` = none).
    """

    recipe: str
    where: str
    text: str
    conditions: tuple[Condition, ...]
    seeds: tuple[int, ...] | None
    wall_s: float | None

    def covers(self, seed: int, default_seed: int) -> bool:
        """Whether the claim is about runs with ``seed``."""
        return seed in (self.seeds if self.seeds is not None else (default_seed,))


@dataclass
class RunResult:
    """What one recipe run achieved.

    Attributes:
        recipe: Recipe name.
        seed: The run's seed.
        wall_s: Wall seconds of the launcher command (measured around the process).
        metrics: ``{metric: value}`` for the ``METRICS`` the run recorded.
        run_dir: The run directory.
        error: Why the run produced no usable summary (``None`` = it did).
    """

    recipe: str
    seed: int
    wall_s: float
    metrics: dict[str, float] = field(default_factory=dict)
    run_dir: str = ""
    error: str | None = None


@dataclass
class Verdict:
    """A claim checked against one run.

    Attributes:
        claim: The claim.
        passed: Whether every clause held.
        failures: One line per clause that did not hold (or why it could not be checked).
    """

    claim: Claim
    passed: bool
    failures: list[str]


def parse_claim(text: str, *, recipe: str, where: str) -> Claim:
    """Parse the part of a claim line after ``# claim:``.

    Args:
        text: The clauses, e.g. ``"val_accuracy_gain >= 0.10 on seeds 42,1,2; wall <= 300 s"``.
        recipe: The recipe's name.
        where: ``file:line`` of the line (for error messages).

    Returns:
        The claim.

    Raises:
        ClaimError: A clause is malformed, names an unknown metric, repeats ``on seeds`` or
            ``wall``, lists no or non-integer seeds, or the line has no metric clause.
    """
    conditions: list[Condition] = []
    seeds: tuple[int, ...] | None = None
    wall_s: float | None = None
    for raw in text.split(";"):
        clause = " ".join(raw.split())
        if not clause:
            raise ClaimError(f"{where}: empty clause in claim {text.strip()!r}")
        wall = _WALL_RE.match(clause)
        if wall is not None:
            if wall_s is not None:
                raise ClaimError(f"{where}: 'wall' given twice in claim {text.strip()!r}")
            wall_s = float(wall.group("value"))
            if wall_s <= 0:
                raise ClaimError(f"{where}: wall bound must be > 0 s, got {clause!r}")
            continue
        if clause.split()[0].startswith("wall"):
            raise ClaimError(f"{where}: cannot parse clause {clause!r}; expected 'wall <= <number> s'")
        m = _METRIC_RE.match(clause)
        if m is None:
            raise ClaimError(
                f"{where}: cannot parse clause {clause!r}; expected '<metric> <op> <number> "
                f"[on seeds a,b,...]' or 'wall <= <number> s' (metrics: {', '.join(METRICS)})"
            )
        if m.group("metric") not in METRICS:
            raise ClaimError(
                f"{where}: unknown metric {m.group('metric')!r} in {clause!r}; "
                f"known: {', '.join(METRICS)}"
            )
        conditions.append(Condition(m.group("metric"), m.group("op"), float(m.group("value"))))
        if m.group("seeds") is not None:
            if seeds is not None:
                raise ClaimError(f"{where}: 'on seeds' given twice in claim {text.strip()!r}")
            seeds = _parse_seeds(m.group("seeds"), where=where)
    if not conditions:
        raise ClaimError(f"{where}: claim {text.strip()!r} has no metric clause")
    return Claim(recipe, where, " ".join(text.split()), tuple(conditions), seeds, wall_s)


def _parse_seeds(text: str, *, where: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not re.fullmatch(r"-?\d+", p) for p in parts):
        raise ClaimError(f"{where}: seeds must be comma-separated integers, got {text.strip()!r}")
    seeds = tuple(int(p) for p in parts)
    if len(set(seeds)) != len(seeds):
        raise ClaimError(f"{where}: seed listed twice in {text.strip()!r}")
    return seeds


def parse_recipe_claims(path: Path) -> list[Claim]:
    """Every claim in a recipe's leading comment block.

    Args:
        path: The recipe file.

    Returns:
        Its claims in file order.

    Raises:
        ClaimError: A claim is malformed, a ``# claim:`` line stands after the header, or the
            recipe has no claim at all (each message names the file, and the line if any).
    """
    claims: list[Claim] = []
    in_header = True
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        where = f"{path}:{number}"
        if in_header and stripped and not stripped.startswith("#"):
            in_header = False
        if not stripped.startswith(CLAIM_PREFIX):
            continue
        if not in_header:
            raise ClaimError(f"{where}: claims belong in the leading comment block of the recipe")
        claims.append(parse_claim(stripped[len(CLAIM_PREFIX):], recipe=path.stem, where=where))
    if not claims:
        raise ClaimError(f"{path}: no '{CLAIM_PREFIX}' line in the recipe's header")
    return claims


def default_seed(recipe_path: Path, root_config: Path = ROOT_CONFIG) -> int:
    """The seed a recipe runs with when none is given: its own ``seed`` key, else the root's.

    Args:
        recipe_path: The recipe file.
        root_config: The root config file (``conf/config.yaml``).

    Returns:
        The seed.

    Raises:
        ClaimError: Neither file sets an integer ``seed``.
    """
    from omegaconf import OmegaConf

    for source in (recipe_path, root_config):
        value = OmegaConf.load(source).get("seed")
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ClaimError(f"{source}: seed must be an integer, got {value!r}")
            return int(value)
    raise ClaimError(f"{root_config}: no 'seed' key")


def seeds_to_run(claims: Sequence[Claim], default: int, *, all_claimed: bool) -> list[int]:
    """The seeds to run a recipe at.

    Args:
        claims: The recipe's claims.
        default: The recipe's default seed.
        all_claimed: Every seed any claim names (else only the first one).

    Returns:
        Distinct seeds in the order the claims name them.
    """
    seeds: list[int] = []
    for claim in claims:
        for seed in claim.seeds if claim.seeds is not None else (default,):
            if seed not in seeds:
                seeds.append(seed)
    return seeds if all_claimed else seeds[:1]


def metrics_from_summary(summary: Mapping[str, Any]) -> dict[str, float]:
    """The claimable metrics a run's ``summary.json`` records.

    Args:
        summary: The parsed ``summary.json`` of a completed run.

    Returns:
        ``{metric: value}``; a metric the run did not record (no warm start, no held-out
        accuracy) is absent.
    """
    out: dict[str, float] = {}
    phases = summary.get("phases") or {}
    final = phases.get(summary.get("final_phase", ""), {})
    if final.get("val_accuracy") is not None:
        out["val_accuracy"] = float(final["val_accuracy"])
    warm = phases.get("warm_start", {})
    if warm.get("val_accuracy") is not None:
        out["warm_start_val_accuracy"] = float(warm["val_accuracy"])
    if summary.get("accuracy_gain") is not None:
        out["val_accuracy_gain"] = float(summary["accuracy_gain"])
    if final.get("initial_val_accuracy") is not None:
        out["initial_val_accuracy"] = float(final["initial_val_accuracy"])
        if "val_accuracy" in out:
            out["main_phase_val_accuracy_gain"] = out["val_accuracy"] - out["initial_val_accuracy"]
    return out


def check_claim(claim: Claim, result: RunResult) -> Verdict:
    """Check one claim against one run.

    Args:
        claim: The claim.
        result: The run (a failed run fails every claim).

    Returns:
        The verdict.
    """
    if result.error is not None:
        return Verdict(claim, False, [f"run failed: {result.error}"])
    failures: list[str] = []
    for cond in claim.conditions:
        value = result.metrics.get(cond.metric)
        if value is None:
            failures.append(f"{cond.metric} not recorded by the run")
        elif not OPS[cond.op](value, cond.threshold):
            failures.append(f"{cond.metric} = {value:.3f}, claimed {cond.op} {cond.threshold:g}")
    if claim.wall_s is not None and result.wall_s > claim.wall_s:
        failures.append(f"wall {result.wall_s:.0f} s, claimed <= {claim.wall_s:g} s")
    return Verdict(claim, not failures, failures)


def launch_command(recipe: str, seed: int, run_dir: Path, overrides: Sequence[str] = ()) -> list[str]:
    """The launcher command line of one recipe run.

    Args:
        recipe: Recipe name.
        seed: Seed.
        run_dir: The run directory (Hydra's ``hydra.run.dir``).
        overrides: Extra Hydra overrides, appended last.

    Returns:
        The argv.
    """
    return [
        sys.executable,
        str(LAUNCHER),
        f"recipe={recipe}",
        f"seed={seed}",
        f"hydra.run.dir={run_dir}",
        "logger.progress_bar=false",
        *overrides,
    ]


def run_recipe(
    recipe: str, seed: int, run_dir: Path, *, overrides: Sequence[str] = (), timeout_s: float = 3600.0
) -> RunResult:
    """Run one recipe through the launcher and read its summary.

    Args:
        recipe: Recipe name.
        seed: Seed.
        run_dir: The run directory (must not exist yet).
        overrides: Extra Hydra overrides.
        timeout_s: Kill the run after this many seconds.

    Returns:
        The run's result; ``error`` says why when the launcher failed, timed out or wrote no
        completed summary.
    """
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.parent / f"{run_dir.name}.log"
    cmd = launch_command(recipe, seed, run_dir, overrides)
    t0 = time.perf_counter()
    error: str | None = None
    with log_path.open("w", encoding="utf-8") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
            if proc.returncode != 0:
                error = f"launcher exited {proc.returncode} (log: {log_path})"
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout_s:g} s (log: {log_path})"
    wall = time.perf_counter() - t0
    _wall_record(run_dir).write_text(json.dumps({"wall_s": wall, "error": error}), encoding="utf-8")
    return read_run(recipe, seed, run_dir, wall, error)


def _wall_record(run_dir: Path) -> Path:
    return run_dir.parent / f"{run_dir.name}.wall.json"


def read_run(recipe: str, seed: int, run_dir: Path, wall_s: float, error: str | None = None) -> RunResult:
    """The result of a finished run from its ``summary.json``.

    Args:
        recipe: Recipe name.
        seed: Seed.
        run_dir: The run directory.
        wall_s: Wall seconds of the launcher command.
        error: Why the launcher failed (``None`` = it exited 0).

    Returns:
        The result; ``error`` is set when the run wrote no completed summary.
    """
    result = RunResult(recipe, seed, wall_s, run_dir=str(run_dir), error=error)
    summary_path = run_dir / "summary.json"
    if error is None:
        if not summary_path.is_file():
            result.error = f"no {summary_path}"
        else:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
            if summary.get("status") != "completed":
                result.error = f"{summary_path}: status {summary.get('status')!r}: {summary.get('error')}"
            else:
                result.metrics = metrics_from_summary(summary)
    return result


def recheck_run(recipe: str, seed: int, run_dir: Path) -> RunResult:
    """The result of a run an earlier invocation made in the same work directory.

    Args:
        recipe: Recipe name.
        seed: Seed.
        run_dir: The run directory.

    Returns:
        The result (``error`` says so when the earlier invocation left no record of the run).
    """
    record = _wall_record(run_dir)
    if not record.is_file():
        return RunResult(recipe, seed, 0.0, run_dir=str(run_dir), error=f"not run yet: no {record}")
    data = json.loads(record.read_text(encoding="utf-8"))
    return read_run(recipe, seed, run_dir, float(data["wall_s"]), data.get("error"))


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def table_rows(
    results: Sequence[RunResult], claims: Mapping[str, Sequence[Claim]], defaults: Mapping[str, int]
) -> list[list[str]]:
    """One table row per (run, claim covering its seed).

    Args:
        results: The runs.
        claims: ``{recipe: claims}``.
        defaults: ``{recipe: default seed}``.

    Returns:
        Rows of ``recipe, seed, warm-start acc, final acc, gain, wall, claim, result`` cells.
    """
    rows: list[list[str]] = []
    for res in results:
        for claim in claims[res.recipe]:
            if not claim.covers(res.seed, defaults[res.recipe]):
                continue
            verdict = check_claim(claim, res)
            outcome = "PASS" if verdict.passed else "FAIL: " + "; ".join(verdict.failures)
            rows.append(
                [
                    res.recipe,
                    str(res.seed),
                    _fmt(res.metrics.get("warm_start_val_accuracy")),
                    _fmt(res.metrics.get("val_accuracy")),
                    _fmt(res.metrics.get("val_accuracy_gain"), signed=True),
                    f"{res.wall_s:.0f} s",
                    claim.text,
                    outcome,
                ]
            )
    return rows


HEADERS = ["recipe", "seed", "warm-start acc", "final acc", "gain", "wall", "claim", "result"]


def markdown_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as a GitHub markdown table (``|`` in cells escaped).

    Args:
        rows: ``table_rows`` output.

    Returns:
        The table, ending with a newline.
    """
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    return "\n".join(lines) + "\n"


def plain_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as an aligned plain-text table for the console."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADERS)]
    out = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))]
    out.extend("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(out)


def select_recipes(names: str | None, recipes_dir: Path = RECIPES_DIR) -> list[Path]:
    """The recipe files to check.

    Args:
        names: Comma-separated recipe names (``None`` = every recipe, sorted).
        recipes_dir: The recipes directory.

    Returns:
        The recipe paths.

    Raises:
        ClaimError: A named recipe does not exist (the message lists the known ones).
    """
    known = sorted(p.stem for p in recipes_dir.glob("*.yaml"))
    if names is None:
        return [recipes_dir / f"{n}.yaml" for n in known]
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in known]
    if unknown or not chosen:
        raise ClaimError(f"--recipes: unknown recipe(s) {unknown or names!r}; known: {', '.join(known)}")
    return [recipes_dir / f"{n}.yaml" for n in chosen]


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the recipes, print and write the table.

    Args:
        argv: Command-line arguments (``None`` = ``sys.argv[1:]``).

    Returns:
        0 when every claim passed, 1 when any failed, 2 on a bad recipe or argument.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default=None, help="comma-separated recipe names (default: all)")
    parser.add_argument("--seeds-from-claims", action="store_true", help="run every seed the claims name")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="where the run directories go (default: a new temp dir)"
    )
    parser.add_argument(
        "--table-out", type=Path, default=None,
        help="markdown table file (default: <work-dir>/recipe_checks.md)",
    )
    parser.add_argument(
        "--override", action="append", default=[], help="extra Hydra override for every run (repeatable)"
    )
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per-run timeout in seconds")
    parser.add_argument(
        "--recheck", action="store_true",
        help="run nothing: check the claims against the runs an earlier call left in --work-dir",
    )
    args = parser.parse_args(argv)
    if args.recheck and args.work_dir is None:
        print("check_recipes: --recheck needs --work-dir (where the earlier runs are)", file=sys.stderr)
        return 2

    try:
        paths = select_recipes(args.recipes)
        claims = {p.stem: parse_recipe_claims(p) for p in paths}
        defaults = {p.stem: default_seed(p) for p in paths}
    except ClaimError as exc:
        print(f"check_recipes: {exc}", file=sys.stderr)
        return 2
    work = args.work_dir if args.work_dir is not None else Path(tempfile.mkdtemp(prefix="check_recipes_"))
    work.mkdir(parents=True, exist_ok=True)
    table_out = args.table_out if args.table_out is not None else work / "recipe_checks.md"
    plan = [
        (p.stem, seed)
        for p in paths
        for seed in seeds_to_run(claims[p.stem], defaults[p.stem], all_claimed=args.seeds_from_claims)
    ]
    print(f"check_recipes: {len(plan)} run(s) into {work}", flush=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    results: list[RunResult] = []
    for recipe, seed in plan:
        run_dir = work / f"{recipe}_seed{seed}"
        print(f"  {recipe} seed={seed} ...", end=" ", flush=True)
        if args.recheck:
            res = recheck_run(recipe, seed, run_dir)
        else:
            res = run_recipe(recipe, seed, run_dir, overrides=args.override, timeout_s=args.timeout_s)
        results.append(res)
        acc = res.metrics
        print(
            f"{res.wall_s:.0f} s, warm start {_fmt(acc.get('warm_start_val_accuracy'))} -> "
            f"{_fmt(acc.get('val_accuracy'))}" + (f" [{res.error}]" if res.error else ""),
            flush=True,
        )
    rows = table_rows(results, claims, defaults)
    print(plain_table(rows))
    extra = f", overrides {' '.join(args.override)}" if args.override else ""
    if args.recheck:
        how = (
            f"Re-checked by `python scripts/check_recipes.py --recheck` at commit {_git_commit()} "
            f"against the runs in {work}"
        )
    else:
        how = (
            f"Measured by `python scripts/check_recipes.py` at commit {_git_commit()}, started {started}, "
            f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}{extra}"
        )
    note = f"{how}; held-out greedy exact-match accuracy; wall = the whole launcher command.\n\n"
    table_out.parent.mkdir(parents=True, exist_ok=True)
    table_out.write_text(note + markdown_table(rows), encoding="utf-8")
    failed = sum(1 for r in rows if r[-1] != "PASS")
    print(f"check_recipes: {len(rows) - failed} PASS, {failed} FAIL; table in {table_out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
