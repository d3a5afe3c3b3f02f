"""Configuration: ConfigStore registration, validation and preflight for every launch.

``register_configs()`` stores the structured schemas and every ``recipes/*.yaml`` as a
``recipe`` option; ``validate_config(cfg)`` refuses undeclared keys, runs every range rule and
checks the (algorithm, data_plane) pair; ``preflight(cfg, run_dir)`` checks the CPU budget and
that output paths are writable.  All run before any process starts.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from nemo_dp.config.algorithm_registry import ALGORITHMS, algorithm, algorithm_names
from nemo_dp.config.keys import check_known_keys
from nemo_dp.config.schema import (
    CheckpointingConfig,
    ClusterConfig,
    EnvConfig,
    GRPOConfig,
    LoggerConfig,
    MasterConfig,
    PolicyConfig,
    PPOConfig,
    SFTConfig,
)


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

_registered: set[str] = set()


class PreflightError(RuntimeError):
    """A check that must pass before Ray starts failed (CPU budget, output paths)."""


def register_configs(recipes_dir: str | os.PathLike[str] | None = None) -> None:
    """Register the schemas and the recipes in Hydra's ConfigStore (idempotent).

    Each ``*.yaml`` in ``recipes_dir`` (default: the repository's ``recipes/``) becomes option
    ``<stem>`` of group ``recipe`` with package ``_global_`` (its ``override /group: choice``
    defaults work as in any group file).
    """
    from hydra.core.config_store import ConfigStore

    from nemo_dp.config.policy import register_policy_configs
    from nemo_dp.data_plane.interfaces import register_data_plane_configs

    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=MasterConfig)
    for name, spec in ALGORITHMS.items():
        # Root-level (not in group ``algorithm``): a schema is no usable option, so it must not
        # show in ``--help`` or tab completion; each group file extends it with
        # ``- /algorithm_<name>_schema@_here_``.
        cs.store(name=f"algorithm_{name}_schema", node=spec.schema_class())
    register_data_plane_configs()
    register_policy_configs()
    root = Path(recipes_dir) if recipes_dir is not None else RECIPES_DIR
    for path in sorted(root.glob("*.yaml")):
        cs.store(group="recipe", name=path.stem, node=OmegaConf.load(path), package="_global_")
    _registered.add(str(root))


def _trainer_lookup(cfg: DictConfig) -> Any:
    from nemo_dp.config.trainer_lookup import validate_trainer_selection

    return validate_trainer_selection(cfg)


def validate_config(cfg: DictConfig, *, check_pair: bool = True) -> MasterConfig:
    """Validate a composed configuration completely, before any process starts.

    Returns the configuration as dataclasses (every ``__post_init__`` rule has run).

    Args:
        cfg: The composed root node (with or without the ``hydra`` node).
        check_pair: Also check that a trainer serves the (algorithm, data_plane) pair
            (``validate_trainer_selection``).

    Raises:
        ValueError: A required key (``???``) is unset (naming the first and listing all), a
            range/legal-value rule failed (naming the full key and the legal values), or the
            (algorithm, data_plane) pair is illegal (naming both keys).
    """
    # A key added with a leading '+' passes Hydra's struct check; check_known_keys refuses it
    # (to_object would drop it silently).
    node = _without_hydra(cfg)
    missing = sorted(k for k in OmegaConf.missing_keys(node))
    if missing:
        raise ValueError(f"{missing[0]}: required value is missing (all missing keys: {missing})")
    check_known_keys(node)
    obj = OmegaConf.to_object(node)
    if not isinstance(obj, MasterConfig):
        raise TypeError(f"config root must use config_schema, got {type(obj).__name__}")
    spec = _spec_of(obj.algorithm)
    if check_pair:
        _check_pair(node)
        if spec.warm_start and obj.algorithm.warm_start.enabled:
            _check_pair(warm_start_config(node))
    return obj


def _spec_of(algo: Any) -> Any:
    """The registered spec whose schema ``algo`` is an instance of."""
    for spec in ALGORITHMS.values():
        if type(algo) is spec.schema_class():
            return spec
    raise ValueError(
        f"algorithm: group file must list its schema first; legal values: {list(algorithm_names())}"
    )


def _without_hydra(cfg: DictConfig) -> DictConfig:
    if "hydra" not in cfg:
        return cfg
    node = cfg.copy()
    with open_dict(node):
        del node["hydra"]
    return node


def _check_pair(node: DictConfig) -> None:
    # The trainer lookup (no import, no output): the same table
    # select_sync_trainer uses later, so validation and selection cannot disagree.
    _trainer_lookup(node)


def warm_start_config(cfg: DictConfig) -> DictConfig:
    """Derive the SFT configuration of an RL run's ``algorithm.warm_start`` phase.

    The result is the same root config with ``algorithm`` replaced by an SFT node built from
    the warm-start keys and ``policy.optimizer.lr`` / ``warmup_steps`` set to the warm-start values, so the
    launcher can select the warm-start trainer through the same factory lookup.  Returns a new
    root ``DictConfig`` (struct mode, ``hydra`` node dropped).

    Raises:
        ValueError: If ``cfg.algorithm`` has no warm start.
    """
    name = cfg.algorithm.name
    if name not in ALGORITHMS or not algorithm(name).warm_start:
        with_warm_start = [n for n, spec in ALGORITHMS.items() if spec.warm_start]
        raise ValueError(
            f"algorithm.warm_start: only {with_warm_start} have a warm start, got {name!r}"
        )
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
    """``path`` can be created and written, checked without creating anything that stays.

    The probe is a temporary file in ``path`` or, when it does not exist yet, in its nearest
    existing ancestor (removed at once), so a refused run leaves no directory behind.  ``key`` is
    the config key holding the path (named in the error).

    Raises:
        PreflightError: A file is in the way, or the directory cannot be written (read-only,
            no permission).
    """
    path = Path(path).absolute()
    probe_dir = path
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise PreflightError(
            f"{key}: output path {str(path)!r} is not writable: {str(probe_dir)!r} is not a directory"
        )
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
        why = f"torch {torch.__version__} (CUDA {build}) sees no CUDA device{seen}" if build else (
            f"torch {torch.__version__} is a CPU-only build"
        )
        raise PreflightError(
            f"policy.device: cuda, but {why} and the run starts its own Ray on this machine "
            "(cluster.address is local); set policy.device=cpu, or install a CUDA torch build "
            "(README, 'Running on GPUs')"
        )


def preflight(cfg: MasterConfig, run_dir: str | os.PathLike[str]) -> None:
    """Checks that must pass before Ray starts; they write nothing.

    * CPU budget: a local Ray gets ``cluster.num_cpus`` logical CPUs; that must not exceed the
      machine's CPUs, the policy workers' compute threads (``dp_size x torch_threads``)
      must fit in it (workers reserve ``num_cpus=0`` but their threads still need cores), and
      it must host the data plane's own actors (TransferQueue's controller and storage units
      reserve one CPU each).
    * Device: ``policy.device=cuda`` with a local Ray needs a CUDA device visible here.
    * Output paths: the run directory and the checkpoint directory can be written (probed
      without creating them); a ``checkpointing.resume_from`` directory exists.

    Raises:
        PreflightError: Naming the key at fault.
        ValueError: The CPU budget cannot host the data plane's actors (names
            ``cluster.num_cpus`` and the actors' keys).
    """
    from nemo_dp.data_plane.registry import ray_cpu_reservation
    from nemo_dp.distributed.ray_init import check_cpu_budget

    machine = os.cpu_count() or 1
    if cfg.cluster.is_local and cfg.cluster.num_cpus > machine:
        raise PreflightError(
            f"cluster.num_cpus: {cfg.cluster.num_cpus} exceeds the {machine} CPUs of this machine"
        )
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
        raise PreflightError(
            f"checkpointing.resume_from: {cfg.checkpointing.resume_from!r} is not a directory"
        )


# Re-exported for type hints in trainers and tests.
__all__ += [
    "MasterConfig",
    "PolicyConfig",
    "SFTConfig",
    "GRPOConfig",
    "PPOConfig",
    "EnvConfig",
    "ClusterConfig",
    "LoggerConfig",
    "CheckpointingConfig",
]
