"""One builder per ``policy`` kind: the only place that maps a kind to code (imported lazily)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from nemo_dp.models.protocol import CausalLM, Tokenizer
from nemo_dp.utils import config_access
from nemo_dp.utils.config_access import REQUIRED

__all__ = [
    "ModelBuilder", "DEFAULT_POLICY_KIND", "cfg_get", "policy_kind", "register_builder", "get_builder",
    "builder_kinds", "build_model", "build_tokenizer", "validate_policy", "load_pretrained_model", "prepare_policy",
    "save_tokenizer", "load_saved_tokenizer", "policy_takes_images", "policy_for_workers",
]

#: Kind used when a ``policy`` node has no ``kind`` key.
DEFAULT_POLICY_KIND = "tiny"


def cfg_get(cfg: Any, key: str, default: Any = REQUIRED) -> Any:
    """``cfg[key]`` of a ``policy`` node of any form; ``KeyError`` naming it when absent without a default."""
    return config_access.cfg_get(cfg, key, default, where="policy config")


@dataclass(frozen=True)
class ModelBuilder:
    """What a ``policy`` kind provides: the functions behind :func:`build_model` and the other helpers below.

    ``build_model`` builds identical weights on every rank given the same arguments.
    """

    kind: str
    build_model: Callable[[Any, int, int], CausalLM]
    build_tokenizer: Callable[[Any], Tokenizer]
    validate: Callable[[Any], None]
    load_pretrained: Callable[[Any, str], CausalLM]
    prepare: Callable[[Any], None] = lambda policy_cfg: None
    save_tokenizer: Callable[[Any, str], None] = lambda policy_cfg, directory: None
    load_saved_tokenizer: Callable[[Any, str], Optional[Tokenizer]] = lambda policy_cfg, directory: None
    takes_images: bool = False


_BUILTIN_MODULES: dict[str, str] = {
    "tiny": "nemo_dp.models.tiny.builder", "hf": "nemo_dp.models.hf.builder", "hf_vlm": "nemo_dp.models.hf.vlm_builder",
}
_REGISTRY: dict[str, ModelBuilder] = {}


def register_builder(builder: ModelBuilder) -> None:
    """Register (or replace) the builder of ``builder.kind``."""
    _REGISTRY[builder.kind] = builder


def builder_kinds() -> list[str]:
    """Every known policy kind (built-in and registered), sorted."""
    return sorted(set(_BUILTIN_MODULES) | set(_REGISTRY))


def get_builder(kind: str) -> ModelBuilder:
    """The builder of policy kind ``kind``; ``ValueError`` naming the legal values for an unknown one."""
    if kind not in _REGISTRY and kind in _BUILTIN_MODULES:
        module = importlib.import_module(_BUILTIN_MODULES[kind])
        register_builder(module.BUILDER)
    if kind not in _REGISTRY:
        raise ValueError(f"policy.kind: got {kind!r}; legal values: {builder_kinds()}")
    return _REGISTRY[kind]


def policy_kind(policy_cfg: Any) -> str:
    """The ``kind`` of a ``policy`` node (``DEFAULT_POLICY_KIND`` without a ``kind`` key)."""
    return str(cfg_get(policy_cfg, "kind", DEFAULT_POLICY_KIND))


def build_model(policy_cfg: Any, *, vocab_size: int, seed: int) -> CausalLM:
    """Build the ``CausalLM`` a ``policy`` node describes (on CPU; identical on every rank for one ``seed``)."""
    return get_builder(policy_kind(policy_cfg)).build_model(policy_cfg, int(vocab_size), int(seed))


def build_tokenizer(policy_cfg: Any) -> Tokenizer:
    """Build the ``Tokenizer`` a ``policy`` node describes."""
    return get_builder(policy_kind(policy_cfg)).build_tokenizer(policy_cfg)


def validate_policy(policy_cfg: Any) -> None:
    """Check a ``policy`` node before any process starts (``ValueError`` naming the key); warn of CPU bfloat16."""
    from nemo_dp.models.precision import resolve_precision, warn_if_no_bf16

    precision = resolve_precision(policy_cfg)
    get_builder(policy_kind(policy_cfg)).validate(policy_cfg)
    if str(cfg_get(policy_cfg, "device", "cpu")) == "cpu":
        warn_if_no_bf16(precision, "cpu")


def load_pretrained_model(policy_cfg: Any, directory: str) -> CausalLM:
    """Load a model that ``save_pretrained`` wrote to ``directory``, with ``policy_cfg``'s kind and settings."""
    return get_builder(policy_kind(policy_cfg)).load_pretrained(policy_cfg, str(directory))


def prepare_policy(policy_cfg: Any) -> None:
    """Build what a ``policy`` node refers to when it can be built locally (driver, before validation)."""
    get_builder(policy_kind(policy_cfg)).prepare(policy_cfg)


def save_tokenizer(policy_cfg: Any, directory: str) -> None:
    """Write a ``policy`` node's tokenizer in its own format into ``directory`` (typically a model's dir)."""
    get_builder(policy_kind(policy_cfg)).save_tokenizer(policy_cfg, str(directory))


def load_saved_tokenizer(policy_cfg: Any, directory: str) -> Optional[Tokenizer]:
    """The tokenizer :func:`save_tokenizer` wrote into ``directory``; ``None`` if it holds none of that kind."""
    return get_builder(policy_kind(policy_cfg)).load_saved_tokenizer(policy_cfg, str(directory))


def policy_takes_images(policy_cfg: Any) -> bool:
    """Whether the ``policy`` node's model reads per-sample images (its builder's ``takes_images``)."""
    return get_builder(policy_kind(policy_cfg)).takes_images


#: ``policy`` keys naming local directories that the Ray workers open themselves.
WORKER_PATH_KEYS: tuple[str, ...] = ("model_name_or_path", "tokenizer_name_or_path")


def policy_for_workers(policy_cfg: Any) -> dict[str, Any]:
    """A plain, resolved copy of the ``policy`` node for the Ray workers, :data:`WORKER_PATH_KEYS` made absolute."""
    from omegaconf import DictConfig, OmegaConf

    out: dict[str, Any] = (
        OmegaConf.to_container(policy_cfg, resolve=True) if isinstance(policy_cfg, DictConfig) else dict(policy_cfg)
    )  # type: ignore[assignment]
    for key in WORKER_PATH_KEYS:
        value = out.get(key)
        if isinstance(value, str) and value.strip():
            out[key] = os.path.abspath(os.path.expanduser(value))
    return out
