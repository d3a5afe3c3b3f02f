"""Structured-config schemas of every Hydra config group except ``data_plane``; their ``__post_init__`` rules
run when ``validate_config`` converts the node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from nemo_dp.config.algorithm_registry import ALGORITHMS, algorithm_names
from nemo_dp.config.async_rollout import AsyncRolloutConfig
from nemo_dp.utils.config_checks import (
    Checked,
    at_least,
    at_least_each,
    at_least_field,
    fail,
    one_of,
    one_of_field,
    positive,
    positive_field,
)
from nemo_dp.config.cluster import ClusterConfig
from nemo_dp.config.env import EnvConfig
from nemo_dp.config.logging import MlflowConfig, TensorBoardConfig, WandbConfig

__all__ = [
    "ALGORITHM_NAMES",
    "SEQUENCE_PACKING_ALGORITHMS",
    "ModelSchema",
    "OptimizerConfig",
    "GenerationConfig",
    "DynamicBatchingConfig",
    "SequencePackingConfig",
    "PolicyConfig",
    "train_micro_batch_rows",
    "SFTConfig",
    "GRPOLossConfig",
    "DynamicSamplingConfig",
    "WarmStartConfig",
    "GRPOConfig",
    "PPOValueConfig",
    "PPOConfig",
    "EnvConfig",
    "ClusterConfig",
    "LoggerConfig",
    "CheckpointingConfig",
    "MasterConfig",
    "algorithm_schemas",
]

ALGORITHM_NAMES: tuple[str, ...] = algorithm_names()
SEQUENCE_PACKING_ALGORITHMS: tuple[str, ...] = (
    "concatenative",
    "first_fit_decreasing",
    "modified_first_fit_decreasing",
)
OPTIMIZER_NAMES: tuple[str, ...] = ("adamw",)
LR_SCHEDULES: tuple[str, ...] = ("constant", "cosine")
MICROBATCH_ORDERS: tuple[str, ...] = ("packer", "largest_first")


@dataclass
class ModelSchema(Checked, key="policy.model"):
    """``policy.model``: the tiny causal transformer (vocabulary size comes from the tokenizer)."""

    n_layers: int = at_least_field(2, 1)
    d_model: int = at_least_field(128, 1)
    n_heads: int = at_least_field(4, 1)
    max_seq_len: int = 32
    dropout: float = 0.0

    def check(self) -> None:
        if self.d_model % self.n_heads != 0:
            fail(
                "policy.model.d_model", f"must be divisible by policy.model.n_heads={self.n_heads}, got {self.d_model}"
            )
        at_least("policy.model.max_seq_len", self.max_seq_len, 2)
        if not 0.0 <= self.dropout < 1.0:
            fail("policy.model.dropout", f"must be in [0, 1), got {self.dropout!r}")


@dataclass
class OptimizerConfig(Checked, key="policy.optimizer"):
    """``policy.optimizer``: AdamW, linear warm-up, then constant or cosine decay to ``min_lr_ratio x lr``."""

    name: str = one_of_field("adamw", OPTIMIZER_NAMES)
    lr: float = 1e-3
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: str = "constant"
    min_lr_ratio: float = 0.1

    def check(self) -> None:
        one_of("policy.optimizer.schedule", self.schedule, LR_SCHEDULES)
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            fail("policy.optimizer.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio!r}")
        positive("policy.optimizer.lr", self.lr)
        at_least("policy.optimizer.weight_decay", self.weight_decay, 0.0)
        for key, value in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not 0.0 <= value < 1.0:
                fail(f"policy.optimizer.{key}", f"must be in [0, 1), got {value!r}")
        positive("policy.optimizer.eps", self.eps)
        at_least("policy.optimizer.warmup_steps", self.warmup_steps, 0)


@dataclass
class GenerationConfig(Checked, key="policy.generation"):
    """``policy.generation``: sampling settings for rollouts (evaluation is always greedy)."""

    max_new_tokens: int = at_least_field(6, 1)
    temperature: float = positive_field(1.0)


@dataclass
class DynamicBatchingConfig(Checked, key="policy.dynamic_batching"):
    """``policy.dynamic_batching``: token-budgeted microbatches planned by the shared planner."""

    enabled: bool = False
    train_mb_tokens: int = at_least_field(256, 1)
    logprob_mb_tokens: int = at_least_field(512, 1)
    sequence_length_round: int = at_least_field(4, 1)


@dataclass
class SequencePackingConfig(Checked, key="policy.sequence_packing"):
    """``policy.sequence_packing``: bin-packed microbatches (every rank gets the same count)."""

    enabled: bool = False
    train_mb_tokens: int = at_least_field(256, 1)
    logprob_mb_tokens: int = at_least_field(512, 1)
    algorithm: str = one_of_field("modified_first_fit_decreasing", SEQUENCE_PACKING_ALGORITHMS)
    sequence_length_pad_multiple: int = at_least_field(1, 1)
    microbatch_order: str = one_of_field("packer", MICROBATCH_ORDERS)


@dataclass
class PolicyConfig:
    """``policy``: the worker group, the model, its optimizer and the batching of its work.

    ``train_global_batch_size`` rows make one optimizer step over ``dp_size`` workers, each in
    ``train_micro_batch_size``-row microbatches (``None``: its whole share in one pass).
    ``init_from``: another run's policy checkpoint to start from (``checkpointing.resume_from`` wins).
    ``reuse_host_memory``: each worker keeps its freed CPU memory for the next pass (glibc), where
    large buffers would otherwise be mapped and unmapped every pass (page faults).
    """

    dp_size: int = 2
    torch_threads: int = 1
    reuse_host_memory: bool = True
    model: ModelSchema = field(default_factory=ModelSchema)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    train_global_batch_size: int = 32
    train_micro_batch_size: Optional[int] = None
    logprob_batch_size: int = 32
    generation_batch_size: int = 64
    max_grad_norm: float = 1.0
    dynamic_batching: DynamicBatchingConfig = field(default_factory=DynamicBatchingConfig)
    sequence_packing: SequencePackingConfig = field(default_factory=SequencePackingConfig)
    init_from: Optional[str] = None

    def __post_init__(self) -> None:
        if self.init_from is not None and not str(self.init_from).strip():
            fail("policy.init_from", "must be a checkpoint path or null, got an empty string")
        at_least_each("policy", self, dp_size=1, torch_threads=1, train_global_batch_size=1)
        if self.train_micro_batch_size is not None:
            at_least("policy.train_micro_batch_size", self.train_micro_batch_size, 1)
        at_least_each("policy", self, logprob_batch_size=1, generation_batch_size=1)
        if self.train_global_batch_size % self.dp_size != 0:
            fail(
                "policy.train_global_batch_size",
                f"must be a multiple of policy.dp_size={self.dp_size}, got {self.train_global_batch_size}",
            )
        per_worker = self.train_global_batch_size // self.dp_size
        if self.train_micro_batch_size is not None and self.train_micro_batch_size > per_worker:
            fail(
                "policy.train_micro_batch_size",
                f"must be <= the per-worker batch policy.train_global_batch_size / policy.dp_size "
                f"= {self.train_global_batch_size} / {self.dp_size} = {per_worker}, "
                f"got {self.train_micro_batch_size}",
            )
        positive("policy.max_grad_norm", self.max_grad_norm)


def train_micro_batch_rows(policy_cfg: Any) -> int:
    """``train_micro_batch_size``, or when ``None`` ``train_global_batch_size // dp_size``, of a ``policy`` node."""
    mbs = policy_cfg.train_micro_batch_size
    return int(mbs) if mbs is not None else int(policy_cfg.train_global_batch_size) // int(policy_cfg.dp_size)


def _check_common_algorithm(cfg: Any, expected_name: str) -> None:
    one_of("algorithm.name", cfg.name, (expected_name,))
    at_least_each("algorithm", cfg, max_steps=1, val_period=0, val_samples=1)


@dataclass
class SFTConfig:
    """``algorithm`` for SFT: next-token loss on response tokens (``val_period`` 0: evaluate only at the end)."""

    name: str = "sft"
    max_steps: int = 100
    num_train_samples: int = 2000
    val_period: int = 50
    val_samples: int = 100
    val_at_start: bool = False
    shuffle: bool = True

    def __post_init__(self) -> None:
        _check_common_algorithm(self, "sft")
        at_least("algorithm.num_train_samples", self.num_train_samples, 1)


@dataclass
class GRPOLossConfig(Checked, key="algorithm.loss"):
    """``algorithm.loss``: clipped policy gradient with a k3 KL penalty to the reference."""

    ratio_clip_min: float = at_least_field(0.2, 0.0)
    ratio_clip_max: float = at_least_field(0.2, 0.0)
    reference_policy_kl_penalty: float = at_least_field(0.01, 0.0)
    token_level_loss: bool = True


@dataclass
class DynamicSamplingConfig(Checked, key="algorithm.dynamic_sampling"):
    """``algorithm.dynamic_sampling``: drop zero-std groups, keep generating to fill the batch."""

    enabled: bool = False
    max_gen_batches: int = at_least_field(4, 1)


@dataclass
class WarmStartConfig:
    """``algorithm.warm_start``: an SFT phase run through the same factory selection first."""

    enabled: bool = False
    max_steps: int = 100
    num_train_samples: int = 2000
    lr: float = 1e-3
    warmup_steps: int = 0
    val_samples: int = 100

    def __post_init__(self) -> None:
        at_least_each("algorithm.warm_start", self, max_steps=1, warmup_steps=0, num_train_samples=1)
        positive("algorithm.warm_start.lr", self.lr)
        at_least("algorithm.warm_start.val_samples", self.val_samples, 1)


class _RLAlgorithm:
    """What the RL algorithms' schemas share: rows per step and the cross-group rules."""

    @property
    def samples_per_step(self) -> int:
        """Rows trained per step: prompts x generations."""
        return self.num_prompts_per_step * self.num_generations_per_prompt  # type: ignore[attr-defined]

    def _check_rl(self, expected_name: str) -> None:
        _check_common_algorithm(self, expected_name)
        at_least_each("algorithm", self, num_prompts_per_step=1, num_generations_per_prompt=1)

    def check_root(self, root: Any) -> None:
        """Rules that need the whole config (batch divisibility, sequence room; called by ``MasterConfig``)."""
        if self.samples_per_step % root.policy.train_global_batch_size != 0:
            fail(
                "policy.train_global_batch_size",
                f"must divide algorithm.num_prompts_per_step x "
                f"algorithm.num_generations_per_prompt = {self.samples_per_step}, "
                f"got {root.policy.train_global_batch_size}",
            )
        env = root.env
        longest = env.digits * 2 + 3 + root.policy.generation.max_new_tokens
        if longest > root.policy.model.max_seq_len and env.rl_jsonl is None and env.rl_data is None and env.name == "arithmetic":
            fail(
                "policy.model.max_seq_len",
                f"must be >= {longest} (bos + prompt + policy.generation.max_new_tokens) "
                f"for env.digits={env.digits}, got {root.policy.model.max_seq_len}",
            )


@dataclass
class GRPOConfig(_RLAlgorithm):
    """``algorithm`` for GRPO (``reuse_train_forward_logprobs``: when a rollout is one optimizer step, the
    synchronous trainers take ``prev_logprobs`` from the training forward, the same numbers)."""

    name: str = "grpo"
    max_steps: int = 50
    num_prompts_per_step: int = 16
    num_generations_per_prompt: int = 8
    num_train_prompts: int = 2000
    val_period: int = 10
    val_samples: int = 100
    val_at_start: bool = True
    use_leave_one_out_baseline: bool = True
    normalize_rewards: bool = True
    overlong_filtering: bool = False
    reuse_train_forward_logprobs: bool = True
    loss: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    async_rollout: AsyncRolloutConfig = field(default_factory=AsyncRolloutConfig)

    def __post_init__(self) -> None:
        self._check_rl("grpo")
        if self.use_leave_one_out_baseline and self.num_generations_per_prompt < 2:
            fail(
                "algorithm.num_generations_per_prompt",
                f"must be >= 2 with algorithm.use_leave_one_out_baseline=true, got {self.num_generations_per_prompt}",
            )
        at_least("algorithm.num_train_prompts", self.num_train_prompts, self.num_prompts_per_step)


@dataclass
class PPOValueConfig(Checked, key="algorithm.value"):
    """``algorithm.value``: the critic's optimizer and value-loss clipping."""

    lr: float = positive_field(1e-3)
    warmup_steps: int = at_least_field(0, 0)
    value_clip: float = at_least_field(0.2, 0.0)
    init_from_policy: bool = True


@dataclass
class PPOConfig(_RLAlgorithm):
    """``algorithm`` for PPO: a critic with GAE, clipped policy and value losses, ppo_epochs."""

    name: str = "ppo"
    max_steps: int = 40
    num_prompts_per_step: int = 32
    num_generations_per_prompt: int = 2
    num_train_prompts: int = 2000
    val_period: int = 10
    val_samples: int = 100
    val_at_start: bool = True
    ppo_epochs: int = 2
    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.02
    whiten_advantages: bool = True
    overlong_filtering: bool = False
    loss: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    value: PPOValueConfig = field(default_factory=PPOValueConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)

    def __post_init__(self) -> None:
        self._check_rl("ppo")
        at_least_each("algorithm", self, num_train_prompts=self.num_prompts_per_step, ppo_epochs=1)
        for key, value in (("gamma", self.gamma), ("lam", self.lam)):
            if not 0.0 <= value <= 1.0:
                fail(f"algorithm.{key}", f"must be in [0, 1], got {value!r}")
        at_least("algorithm.kl_coef", self.kl_coef, 0.0)


@dataclass
class LoggerConfig:
    """``logger``: what a run writes and shows (paths relative to the run directory)."""

    metrics_file: str = "metrics.jsonl"
    plot_file: str = "training_curves.png"
    plot: bool = True
    progress_bar: bool = True
    num_val_examples_to_print: int = 0
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)

    def __post_init__(self) -> None:
        if not self.metrics_file:
            fail("logger.metrics_file", "must be a non-empty file name")
        if not self.plot_file.endswith(".png"):
            fail("logger.plot_file", f"must end with '.png', got {self.plot_file!r}")
        at_least("logger.num_val_examples_to_print", self.num_val_examples_to_print, 0)


@dataclass
class CheckpointingConfig:
    """``checkpointing``: periodic atomic checkpoints (``save_period`` 0: only at the end) and exact resume
    from the latest checkpoint under the root ``resume_from``."""

    enabled: bool = True
    checkpoint_dir: str = "checkpoints"
    save_period: int = 0
    keep_last: int = 2
    resume_from: Optional[str] = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        if not self.checkpoint_dir:
            fail("checkpointing.checkpoint_dir", "must be a non-empty path")
        at_least_each("checkpointing", self, save_period=0, keep_last=1)


@dataclass
class MasterConfig:
    """The root schema (``config_schema``); ``algorithm``, ``data_plane``, ``policy``: typed by their group file."""

    algorithm: Any = MISSING
    data_plane: Any = MISSING
    policy: Any = MISSING
    env: EnvConfig = MISSING  # type: ignore[assignment]
    cluster: ClusterConfig = MISSING  # type: ignore[assignment]
    logger: LoggerConfig = MISSING  # type: ignore[assignment]
    checkpointing: CheckpointingConfig = MISSING  # type: ignore[assignment]
    seed: int = 42

    def __post_init__(self) -> None:
        at_least("seed", self.seed, 0)
        algo = self.algorithm
        if type(algo) not in algorithm_schemas():
            fail(
                "algorithm", f"unknown algorithm schema {type(algo).__name__}; legal values: {list(algorithm_names())}"
            )
        check_root = getattr(algo, "check_root", None)
        if check_root is not None:
            check_root(self)


def algorithm_schemas() -> tuple[type, ...]:
    """The config dataclass of every registered algorithm."""
    return tuple(spec.schema_class() for spec in ALGORITHMS.values())
