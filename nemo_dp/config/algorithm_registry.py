"""The one table of training algorithms (:data:`ALGORITHMS`); nothing else lists algorithm names.

Each ``AlgorithmSpec`` bundles an algorithm's name, schema, input builder and the trainer per
data-plane backend as ``"module:attr"`` strings, resolved only when used, so this module imports
only the standard library.  To add one (e.g. DPO): write its module (config dataclass, trainers,
input builder), call ``register_algorithm(AlgorithmSpec(...))`` at the bottom of this file, and
add ``conf/algorithm/<name>.yaml`` listing ``/algorithm_<name>_schema@_here_`` first.
"""

from __future__ import annotations

from collections.abc import Mapping
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


@dataclass(frozen=True)
class TrainerMode:
    """A second way to run an algorithm, switched on by one config key (e.g. asynchronous GRPO).

    Attributes:
        name: The mode's word in the progress line (``"asynchronous"``).
        switch_key: The config key that turns it on, named in errors.
        selector: ``"module:function"`` taking the root config and returning whether the mode is
            on (it may raise ``ValueError`` naming a key for a combination the mode refuses).
        trainers: Data-plane backend kind -> ``"module:function"`` of the mode's trainer; a kind
            absent here cannot run the mode.
    """

    name: str
    switch_key: str
    selector: str
    trainers: Mapping[str, str]

    def __post_init__(self) -> None:
        for what, target in (("selector", self.selector), *self.trainers.items()):
            if not isinstance(target, str) or target.count(":") != 1:
                raise ValueError(f"mode {self.name!r}: {what} must be 'module:attr', got {target!r}")
        object.__setattr__(self, "trainers", MappingProxyType(dict(self.trainers)))


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm.

    Attributes:
        name: ``algorithm.name`` and the ``conf/algorithm/<name>.yaml`` option.
        schema: ``"module:Class"`` of its structured-config dataclass (stored in Hydra as
            ``<name>_schema``).
        input_builder: ``"module:function"`` building its ``TrainerInputs`` from the config.
        trainers: Data-plane backend kind (``disabled``, ``local``, ``transfer_queue``,
            ``ray_store``) -> ``"module:function"`` of the trainer; a kind absent here is an illegal pair.
        requires_cross_process: The trainer moves rows between processes (rollout workers,
            driver, trainers), so a backend without ``cross_process`` cannot serve it.
        warm_start: The config has an ``algorithm.warm_start`` SFT phase.
        label: Progress-line label; defaults to the upper-cased name.
        modes: Other ways to run it (:class:`TrainerMode`), tried in order; the first whose
            selector returns true replaces ``trainers``.
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
        for what, target in (("schema", self.schema), ("input_builder", self.input_builder)):
            if not isinstance(target, str) or target.count(":") != 1:
                raise ValueError(
                    f"algorithm {self.name!r}: {what} must be 'module:attr', got {target!r}"
                )
        if not self.trainers:
            raise ValueError(f"algorithm {self.name!r}: trainers must name at least one backend")
        for kind, target in self.trainers.items():
            if not isinstance(target, str) or target.count(":") != 1:
                raise ValueError(
                    f"algorithm {self.name!r}: trainers[{kind!r}] must be 'module:function', "
                    f"got {target!r}"
                )
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
    """Add ``spec`` to :data:`ALGORITHMS`.

    Raises:
        ValueError: An algorithm of that name is already registered.
    """
    if spec.name in ALGORITHMS:
        raise ValueError(f"algorithm {spec.name!r} is already registered")
    ALGORITHMS[spec.name] = spec
    return spec


def algorithm(name: str) -> AlgorithmSpec:
    """The spec registered as ``name``.

    Raises:
        ValueError: Unknown name (lists the registered ones).
    """
    spec = ALGORITHMS.get(name)
    if spec is None:
        raise ValueError(
            f"unknown algorithm {name!r} (algorithm.name); known algorithms: {sorted(ALGORITHMS)}"
        )
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
