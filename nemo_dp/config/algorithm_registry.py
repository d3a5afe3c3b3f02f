"""The one table of training algorithms (:data:`ALGORITHMS`); nothing else lists algorithm names.

Targets are ``"module:attr"`` strings resolved only when used.  To add an algorithm, call
``register_algorithm`` below and add ``conf/algorithm/<name>.yaml`` listing ``/algorithm_<name>_schema@_here_`` first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from nemo_dp.utils.imports import resolve_target

__all__ = [
    "ALGORITHMS",
    "AlgorithmSpec",
    "TrainerMode",
    "algorithm",
    "algorithm_names",
    "register_algorithm",
    "resolve_target",
]


def _check_targets(owner: str, targets: Iterable[tuple[str, object, str]]) -> None:
    for what, target, form in targets:
        if not isinstance(target, str) or target.count(":") != 1:
            raise ValueError(f"{owner}: {what} must be '{form}', got {target!r}")


@dataclass(frozen=True)
class TrainerMode:
    """A second way to run an algorithm (``"asynchronous"``), on when ``selector`` (``"module:function"`` of the
    root config, which may raise ``ValueError``) says so; a backend kind absent from ``trainers`` cannot run it."""

    name: str
    switch_key: str
    selector: str
    trainers: Mapping[str, str]

    def __post_init__(self) -> None:
        targets = (("selector", self.selector), *self.trainers.items())
        _check_targets(f"mode {self.name!r}", [(what, target, "module:attr") for what, target in targets])
        object.__setattr__(self, "trainers", MappingProxyType(dict(self.trainers)))


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm: ``name`` (``algorithm.name``), its schema class, ``TrainerInputs`` builder and trainers.

    Attributes:
        trainers: Backend kind -> ``"module:function"`` of the trainer; a kind absent here is an illegal pair.
        requires_cross_process: The trainer moves rows between processes, so a backend without
            ``cross_process`` cannot serve it.
        label: Progress-line label; defaults to the upper-cased name.
        modes: Tried in order; the first whose selector returns true replaces ``trainers``.
    """

    name: str
    schema: str
    input_builder: str
    trainers: Mapping[str, str]
    requires_cross_process: bool = False
    warm_start: bool = False
    label: str | None = None
    modes: tuple[TrainerMode, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"AlgorithmSpec.name must be an identifier, got {self.name!r}")
        owner = f"algorithm {self.name!r}"
        _check_targets(owner, [(what, getattr(self, what), "module:attr") for what in ("schema", "input_builder")])
        if not self.trainers:
            raise ValueError(f"{owner}: trainers must name at least one backend")
        _check_targets(owner, [(f"trainers[{kind!r}]", t, "module:function") for kind, t in self.trainers.items()])
        object.__setattr__(self, "trainers", MappingProxyType(dict(self.trainers)))

    @property
    def display_label(self) -> str:
        return self.label if self.label is not None else self.name.upper()

    def schema_class(self) -> type:
        """Import and return the config dataclass."""
        return resolve_target(self.schema)


#: name -> spec, in registration order.
ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add ``spec`` to :data:`ALGORITHMS` (``ValueError`` if its name is taken)."""
    if spec.name in ALGORITHMS:
        raise ValueError(f"algorithm {spec.name!r} is already registered")
    ALGORITHMS[spec.name] = spec
    return spec


def algorithm(name: str) -> AlgorithmSpec:
    """The spec registered as ``name`` (``ValueError`` listing the known names if none)."""
    spec = ALGORITHMS.get(name)
    if spec is None:
        raise ValueError(f"unknown algorithm {name!r} (algorithm.name); known algorithms: {sorted(ALGORITHMS)}")
    return spec


def algorithm_names() -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(ALGORITHMS)


register_algorithm(
    AlgorithmSpec(
        name="sft",
        schema="nemo_dp.config.schema:SFTConfig",
        input_builder="nemo_dp.algorithms.inputs:build_sft_inputs",
        trainers={
            "disabled": "nemo_dp.algorithms.sft:sft_train",
            "local": "nemo_dp.algorithms.sft_sync:sft_train_sync",
            "transfer_queue": "nemo_dp.algorithms.sft_sync:sft_train_sync",
            "ray_store": "nemo_dp.algorithms.sft_sync:sft_train_sync",
        },
    )
)
register_algorithm(
    AlgorithmSpec(
        name="grpo",
        schema="nemo_dp.config.schema:GRPOConfig",
        input_builder="nemo_dp.algorithms.inputs:build_rl_inputs",
        trainers={
            "disabled": "nemo_dp.algorithms.grpo:grpo_train",
            "transfer_queue": "nemo_dp.algorithms.grpo_sync:grpo_train_sync",
            "ray_store": "nemo_dp.algorithms.grpo_sync:grpo_train_sync",
        },
        requires_cross_process=True,
        warm_start=True,
        modes=(
            TrainerMode(
                name="asynchronous",
                switch_key="algorithm.async_rollout.enabled",
                selector="nemo_dp.config.async_rollout:validate_async_rollout_selection",
                trainers={
                    "transfer_queue": "nemo_dp.algorithms.grpo_async:grpo_train_async",
                    "ray_store": "nemo_dp.algorithms.grpo_async:grpo_train_async",
                },
            ),
        ),
    )
)
register_algorithm(
    AlgorithmSpec(
        name="ppo",
        schema="nemo_dp.config.schema:PPOConfig",
        input_builder="nemo_dp.algorithms.inputs:build_rl_inputs",
        trainers={
            "disabled": "nemo_dp.algorithms.ppo:ppo_train",
            "transfer_queue": "nemo_dp.algorithms.ppo_sync:ppo_train_sync",
            "ray_store": "nemo_dp.algorithms.ppo_sync:ppo_train_sync",
        },
        requires_cross_process=True,
        warm_start=True,
    )
)
