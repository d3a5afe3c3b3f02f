"""The run config the launcher composes, for tests of every tier."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def compose_run(overrides: Sequence[str]) -> Any:
    """The ``DictConfig`` that ``conf/config.yaml`` composes from ``overrides`` (recipes registered)."""
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import register_configs

    register_configs(REPO_ROOT / "recipes")
    with initialize_config_dir(str(REPO_ROOT / "conf"), version_base=None):
        return compose("config", overrides=list(overrides))
