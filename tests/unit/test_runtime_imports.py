"""What importing a module really loads, read from ``sys.modules`` in fresh interpreters.

The import contracts (``test_import_contracts.py``) see every ``import`` statement but not
whether it runs at import time, nor what a backend name resolved from a registry loads.  Here
each group of modules is imported in a new interpreter and ``sys.modules`` is read afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA_PLANE = REPO / "nemo_dp" / "data_plane"

#: Helpers, the factory and the data-plane trainers: they reach a backend only through a client
#: object, so importing them must load no adapter, Ray, TransferQueue or transformers.
HELPERS = [
    "nemo_dp.data_plane",
    "nemo_dp.data_plane.interfaces",
    "nemo_dp.data_plane.registry",
    "nemo_dp.data_plane.factory",
    "nemo_dp.data_plane.codec",
    "nemo_dp.data_plane.batch_columns",
    "nemo_dp.data_plane.column_io",
    "nemo_dp.data_plane.driver_mixin",
    "nemo_dp.data_plane.worker_mixin",
    "nemo_dp.data_plane.observability",
    "nemo_dp.models.policy.sft_loader_worker",
    "nemo_dp.config.algorithm_registry",
    "nemo_dp.config.trainer_lookup",
    "nemo_dp.algorithms.selection",
    "nemo_dp.algorithms.grpo_sync",
    "nemo_dp.algorithms.ppo_sync",
    "nemo_dp.algorithms.sft_sync",
    "nemo_dp.algorithms.sft_loader",
]
LEGACY_TRAINERS = ["nemo_dp.algorithms.grpo", "nemo_dp.algorithms.sft", "nemo_dp.algorithms.ppo"]
TQ_ENV = "nemo_dp.data_plane.adapters.transfer_queue_env"
FOREIGN = ("ray", "transfer_queue", "transformers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _data_plane_modules() -> list[str]:
    """Every module under nemo_dp/data_plane, the TransferQueue adapter's included."""
    return sorted(_module_name(p) for p in DATA_PLANE.rglob("*.py"))


def _loaded_by(modules: list[str], *, touch_public_surface: bool = False) -> dict[str, list[str]]:
    """Import ``modules`` in order in one fresh interpreter.

    Returns:
        Per module, the modules its import added to ``sys.modules`` that are top-level packages
        (``ray``, ``torch``, ...) or ``nemo_dp.*`` modules.  A module that an earlier import
        already loaded is reported against that earlier import.  With ``touch_public_surface``
        also ``"<public surface>"``: what resolving every name of ``nemo_dp.data_plane.__all__``
        added.
    """
    code = textwrap.dedent(
        f"""
        import importlib, json, sys

        def interesting(new):
            return sorted(m for m in new if "." not in m or m.startswith("nemo_dp."))

        out = {{}}
        for name in {modules!r}:
            before = set(sys.modules)
            importlib.import_module(name)
            out[name] = interesting(set(sys.modules) - before)
        if {touch_public_surface!r}:
            before = set(sys.modules)
            import nemo_dp.data_plane as dp
            for public in dp.__all__:
                getattr(dp, public)
            out["<public surface>"] = interesting(set(sys.modules) - before)
        print(json.dumps(out))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"importing {modules} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _foreign(loaded: list[str]) -> list[str]:
    return [m for m in loaded if m in FOREIGN]


def _adapters(loaded: list[str]) -> list[str]:
    return [m for m in loaded if m.startswith("nemo_dp.data_plane.adapters.")]


@pytest.mark.timeout(300)
def test_helpers_and_data_plane_modules_load_no_adapter_ray_tq_or_transformers() -> None:
    """The helpers first (no adapter may load yet), then every data-plane module, adapters
    included, and the public surface: Ray and TransferQueue load only when a client is built."""
    rest = [m for m in _data_plane_modules() if m not in HELPERS]
    result = _loaded_by(HELPERS + rest, touch_public_surface=True)
    assert list(result) == HELPERS + rest + ["<public surface>"]
    offenders = {m: _adapters(result[m]) + _foreign(result[m]) for m in HELPERS}
    offenders |= {m: _foreign(result[m]) for m in [*rest, "<public surface>"]}
    assert {m: found for m, found in offenders.items() if found} == {}
    assert "nemo_dp.data_plane.adapters.transfer_queue.client" in rest  # the adapter is probed


@pytest.mark.timeout(120)
def test_legacy_trainers_load_no_data_plane_module() -> None:
    """Also through what they import in turn, e.g. the training checkpoint helpers."""
    result = _loaded_by(LEGACY_TRAINERS)
    loaded = {m: [x for x in new if x.startswith("nemo_dp.data_plane")] for m, new in result.items()}
    assert loaded == {m: [] for m in LEGACY_TRAINERS}


@pytest.mark.timeout(120)
def test_transfer_queue_env_loads_only_the_standard_library() -> None:
    new = _loaded_by([TQ_ENV])[TQ_ENV]
    tops = {m.split(".")[0] for m in new}
    foreign = sorted(t for t in tops if t not in sys.stdlib_module_names and t != "nemo_dp" and not t.startswith("_"))
    assert foreign == []


@pytest.mark.timeout(120)
def test_the_probe_sees_a_violation() -> None:
    """The Local adapter is an adapter: the probe must name it (guards a vacuous check)."""
    found = _loaded_by(["nemo_dp.data_plane.codec", "nemo_dp.data_plane.adapters.local"])
    assert _adapters(found["nemo_dp.data_plane.codec"]) == [] and _foreign(found["nemo_dp.data_plane.codec"]) == []
    assert any(m.startswith("nemo_dp.data_plane.adapters.local") for m in _adapters(found["nemo_dp.data_plane.adapters.local"]))
