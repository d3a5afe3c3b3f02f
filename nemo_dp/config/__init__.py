"""Configuration: ConfigStore registration, validation and preflight, all run before any process starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from nemo_dp.config.algorithm_registry import ALGORITHMS, algorithm
from nemo_dp.config.keys import check_known_keys
from nemo_dp.config.schema import MasterConfig, SFTConfig


__all__ = [
    "REPO_ROOT",
    "CONF_DIR",
    "RECIPES_DIR",
    "register_configs",
    "validate_config",
    "preflight",
    "PreflightError",
    "check_writable",
    "warm_start_config",
]

REPO_ROOT: Path = Path(__file__).resolve().parents[2]
CONF_DIR: Path = REPO_ROOT / "conf"
RECIPES_DIR: Path = REPO_ROOT / "recipes"


class PreflightError(RuntimeError):
    """A check that must pass before Ray starts failed (CPU budget, output paths)."""


def register_configs(recipes_dir: str | os.PathLike[str] | None = None) -> None:
    """Register the schemas, and each ``*.yaml`` of ``recipes_dir`` (default ``recipes/``) as a global
    ``recipe`` option, in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    from nemo_dp.config.policy import register_policy_configs
    from nemo_dp.data_plane.interfaces import register_data_plane_configs

    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=MasterConfig)
    for name, spec in ALGORITHMS.items():
        # Root-level, not in group ``algorithm``, so it stays out of ``--help`` and tab completion.
        cs.store(name=f"algorithm_{name}_schema", node=spec.schema_class())
    register_data_plane_configs()
    register_policy_configs()
    root = Path(recipes_dir) if recipes_dir is not None else RECIPES_DIR
    for path in sorted(root.glob("*.yaml")):
        cs.store(group="recipe", name=path.stem, node=OmegaConf.load(path), package="_global_")


def validate_config(cfg: DictConfig, *, check_pair: bool = True) -> MasterConfig:
    """Validate a composed root node (``hydra`` node optional); return it as dataclasses.

    ``check_pair``: also check that a trainer serves the (algorithm, data_plane) pair and the warm start's.

    Raises:
        ValueError: A required key (``???``) is unset (naming the first and listing all), a
            range/legal-value rule failed (naming the full key), or the pair is illegal.
    """
    from nemo_dp.config.trainer_lookup import validate_trainer_selection

    node = _without_hydra(cfg)
    missing = sorted(k for k in OmegaConf.missing_keys(node))
    if missing:
        raise ValueError(f"{missing[0]}: required value is missing (all missing keys: {missing})")
    check_known_keys(node)  # a '+key' passes Hydra's struct check; to_object would drop it
    obj = OmegaConf.to_object(node)
    if not isinstance(obj, MasterConfig):
        raise TypeError(f"config root must use config_schema, got {type(obj).__name__}")
    if check_pair:
        validate_trainer_selection(node)
        # MasterConfig refused an algorithm node that is no registered schema.
        spec = next(s for s in ALGORITHMS.values() if type(obj.algorithm) is s.schema_class())
        if spec.warm_start and obj.algorithm.warm_start.enabled:
            validate_trainer_selection(warm_start_config(node))
    return obj


def _without_hydra(cfg: DictConfig) -> DictConfig:
    if "hydra" not in cfg:
        return cfg
    node = cfg.copy()
    with open_dict(node):
        del node["hydra"]
    return node


def warm_start_config(cfg: DictConfig) -> DictConfig:
    """A new root config (``hydra`` dropped) for an RL run's warm-start SFT phase: ``algorithm`` built from the
    warm-start keys, which also set ``policy.optimizer.lr`` / ``warmup_steps`` (``ValueError`` without a warm start)."""
    name = cfg.algorithm.name
    if name not in ALGORITHMS or not algorithm(name).warm_start:
        with_warm_start = [n for n, spec in ALGORITHMS.items() if spec.warm_start]
        raise ValueError(f"algorithm.warm_start: only {with_warm_start} have a warm start, got {name!r}")
    ws = cfg.algorithm.warm_start
    sft = OmegaConf.structured(
        SFTConfig(
            max_steps=int(ws.max_steps),
            num_train_samples=int(ws.num_train_samples),
            val_period=0,
            val_samples=int(ws.val_samples),
            val_at_start=False,
            shuffle=True,
        )
    )
    out = _without_hydra(cfg).copy()
    with open_dict(out):
        out.algorithm = sft
    out.policy.optimizer.lr = float(ws.lr)
    out.policy.optimizer.warmup_steps = int(ws.warmup_steps)
    return out


def check_writable(key: str, path: str | os.PathLike[str]) -> None:
    """Check, with a temporary file in ``path`` or its nearest existing ancestor, that config ``key``'s
    ``path`` can be created and written (``PreflightError`` if not)."""
    path = Path(path).absolute()
    probe_dir = path
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise PreflightError(f"{key}: output path {str(path)!r} is not writable: {str(probe_dir)!r} is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=probe_dir, prefix=".write_probe_"):
            pass
    except OSError as exc:
        raise PreflightError(f"{key}: output path {str(path)!r} is not writable: {exc}") from exc


def _check_device(cfg: MasterConfig) -> None:
    """``policy.device=cuda`` needs a CUDA device this machine can see (for a local Ray)."""
    if str(getattr(cfg.policy, "device", "cpu")) != "cuda" or not cfg.cluster.is_local:
        return
    import torch

    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        seen = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        build = torch.version.cuda
        why = f"(CUDA {build}) sees no CUDA device{seen}" if build else "is a CPU-only build"
        raise PreflightError(
            f"policy.device: cuda, but torch {torch.__version__} {why} and the run starts its own Ray on this machine "
            "(cluster.address is local); set policy.device=cpu, or install a CUDA torch build "
            "(README, 'Running on GPUs')"
        )


def preflight(cfg: MasterConfig, run_dir: str | os.PathLike[str]) -> None:
    """Checks that must pass before Ray starts; they write nothing.

    A local Ray's ``cluster.num_cpus`` fits the machine, the workers' ``dp_size x torch_threads``
    threads and the data plane's actors; ``policy.device=cuda`` with a local Ray sees a CUDA device;
    the run and checkpoint directories can be written; a ``checkpointing.resume_from`` directory exists.

    Raises:
        PreflightError: Naming the key at fault.
        ValueError: The CPU budget cannot host the data plane's actors.
    """
    from nemo_dp.data_plane.registry import ray_cpu_reservation
    from nemo_dp.distributed.ray_init import check_cpu_budget

    machine = os.cpu_count() or 1
    if cfg.cluster.is_local and cfg.cluster.num_cpus > machine:
        raise PreflightError(f"cluster.num_cpus: {cfg.cluster.num_cpus} exceeds the {machine} CPUs of this machine")
    threads = cfg.policy.dp_size * cfg.policy.torch_threads
    if cfg.cluster.is_local and threads > cfg.cluster.num_cpus:
        raise PreflightError(
            f"policy.dp_size x policy.torch_threads = {threads} compute threads exceed "
            f"cluster.num_cpus={cfg.cluster.num_cpus}; lower policy.dp_size or policy.torch_threads"
        )
    if cfg.cluster.is_local:
        check_cpu_budget(cfg.cluster.num_cpus, *ray_cpu_reservation(cfg.data_plane))
    _check_device(cfg)
    run = Path(run_dir)
    check_writable("hydra.run.dir", run)
    if cfg.checkpointing.enabled:
        check_writable("checkpointing.checkpoint_dir", run / cfg.checkpointing.checkpoint_dir)
    if cfg.checkpointing.resume_from is not None and not Path(cfg.checkpointing.resume_from).is_dir():
        raise PreflightError(f"checkpointing.resume_from: {cfg.checkpointing.resume_from!r} is not a directory")

