"""What importing a data-plane helper or trainer really loads, checked in fresh interpreters.

A static look at ``import`` lines misses what those imports import in turn; this test imports
each module in a new interpreter and reads ``sys.modules`` afterwards.  Helpers, the factory
and the data-plane trainers must load no adapter (backends are reached through the registry and
the client object), and none of them may load Ray, TransferQueue or transformers at import.
``test_the_probe_sees_a_violation`` proves the probe reports a module that does load them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Modules that must not pull in an adapter, Ray, TransferQueue or transformers when imported.
HELPERS = [
    "nemo_dp.data_plane",
    "nemo_dp.data_plane.interfaces",
    "nemo_dp.data_plane.registry",
    "nemo_dp.data_plane.factory",
    "nemo_dp.data_plane.codec",
    "nemo_dp.data_plane.batch_columns",
    "nemo_dp.data_plane.column_io",
    "nemo_dp.data_plane.preshard",
    "nemo_dp.data_plane.driver_mixin",
    "nemo_dp.data_plane.worker_mixin",
    "nemo_dp.data_plane.observability",
    "nemo_dp.models.policy.colocated_loader",
    "nemo_dp.config.algorithm_registry",
    "nemo_dp.algorithms.grpo_sync",
    "nemo_dp.algorithms.ppo_sync",
    "nemo_dp.algorithms.sft_sync",
]

ADAPTER_PREFIX = "nemo_dp.data_plane.adapters."
FORBIDDEN_TOPS = ("ray", "transfer_queue", "transformers")


def _loaded_by(modules: list[str]) -> dict[str, dict[str, list[str]]]:
    """Import ``modules`` in order in one fresh interpreter; per module, the forbidden modules
    that its import added to ``sys.modules``.

    One interpreter for all keeps the check fast and stays sound: a forbidden module loaded
    through a later module's import is new at the first import that reaches it, so it is
    reported (against that importer) whichever module pulled it in.
    """
    code = textwrap.dedent(
        f"""
        import importlib, json, sys
        out = {{}}
        for name in {modules!r}:
            before = set(sys.modules)
            importlib.import_module(name)
            new = sorted(set(sys.modules) - before)
            out[name] = {{
                "adapters": [m for m in new if m.startswith({ADAPTER_PREFIX!r})],
                "foreign": sorted({{m.split(".")[0] for m in new}} & set({list(FORBIDDEN_TOPS)!r})),
            }}
        print(json.dumps(out))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"importing {modules} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_helpers_and_trainers_load_no_adapter_ray_tq_or_transformers() -> None:
    result = _loaded_by(HELPERS)
    assert list(result) == HELPERS
    offenders = {m: found for m, found in result.items() if found["adapters"] or found["foreign"]}
    assert offenders == {}


@pytest.mark.timeout(120)
def test_the_probe_sees_a_violation() -> None:
    """The Local adapter is an adapter: the probe must name it (guards a vacuous check)."""
    found = _loaded_by(["nemo_dp.data_plane.codec", "nemo_dp.data_plane.adapters.local"])
    assert found["nemo_dp.data_plane.codec"] == {"adapters": [], "foreign": []}
    assert any(
        m.startswith("nemo_dp.data_plane.adapters.local")
        for m in found["nemo_dp.data_plane.adapters.local"]["adapters"]
    )


def test_every_listed_helper_exists() -> None:
    """A renamed module must be renamed here too, not silently dropped from the check."""
    import importlib.util

    missing = [m for m in HELPERS if importlib.util.find_spec(m) is None]
    assert missing == []
