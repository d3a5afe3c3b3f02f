"""Hints, with the closest legal name, for a command line that Hydra refused to compose."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from nemo_dp.config.keys import closest

__all__ = ["group_options", "composition_hints"]


def group_options(conf_dir: str | os.PathLike[str], group: str) -> list[str] | None:
    """The sorted options of ``group`` (``*.yaml`` stems in ``conf_dir/group``), or ``None`` if no such directory."""
    root = Path(conf_dir) / group
    if not group or not root.is_dir():
        return None
    return sorted(p.stem for p in root.glob("*.yaml"))


def _split(override: str) -> tuple[str, str, str] | None:
    """``(prefix, key, value)`` of ``[+|~|++]key=value``, or ``None`` for a bare flag."""
    key, sep, value = override.partition("=")
    if not sep:
        return None
    stripped = key.lstrip("+~")
    return key[: len(key) - len(stripped)], stripped, value


def _group_hints(overrides: Sequence[str], conf_dir: Path) -> list[str]:
    hints = []
    for override in overrides:
        parts = _split(override)
        if parts is None or parts[0] or "." in parts[1]:
            continue
        _, group, value = parts
        options = group_options(conf_dir, group)
        if options is None or value in options or "," in value:
            continue
        guess = closest(value, options)
        fix = f"did you mean {group}={guess}? " if guess is not None else ""
        hints.append(f"hint: {group}={value} is not an option of group {group!r}; {fix}(options: {', '.join(options)})")
    return hints


def _compose_without(overrides: Sequence[str], conf_dir: Path, skip: set[str]) -> DictConfig | None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(conf_dir), version_base=None):
            return compose("config", overrides=[o for o in overrides if o not in skip])
    except Exception:  # a hint is best effort: another problem in the line stops it
        return None
    finally:
        GlobalHydra.instance().clear()


def _key_hints(overrides: Sequence[str], conf_dir: Path) -> list[str]:
    plain = [o for o in overrides if (p := _split(o)) is not None and not p[0] and "." in p[1]
             and not p[1].startswith("hydra.")]  # fmt: skip
    if not plain:
        return []
    cfg = _compose_without(overrides, conf_dir, set(plain))
    if cfg is None:
        return []
    hints = []
    for override in plain:
        _, key, value = _split(override)  # type: ignore[misc]
        parent_key, _, name = key.rpartition(".")
        parent = cfg
        for part in parent_key.split("."):
            parent = parent.get(part) if isinstance(parent, DictConfig) else None
        if not isinstance(parent, DictConfig) or name in parent:
            continue
        guess = closest(name, [str(k) for k in parent.keys()])
        fix = f"; did you mean {parent_key}.{guess}={value}?" if guess is not None else ""
        hints.append(
            f"hint: {key} is not a configuration key, and +{key}={value} would be refused too (nothing reads it){fix}"
        )
    return hints


def composition_hints(overrides: Sequence[str], *, conf_dir: str | os.PathLike[str]) -> list[str]:
    """One hint line per mistyped group option or key of a command line (``sys.argv[1:]``) that failed to compose."""
    conf = Path(conf_dir)
    args = [o for o in overrides if not o.startswith("-")]
    return _group_hints(args, conf) + _key_hints(args, conf)
