"""``PolicyWorker``: one data-parallel rank of the policy (a Ray actor).  Losses divide by all-reduced
global counts and gradients are SUM-reduced, so the update equals the full-batch mean for any ``dp_size``.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_dp.distributed.batched_data_dict import BatchedDataDict, MicrobatchSpec
from nemo_dp.distributed.worker_group import find_free_port, node_ip_address
from nemo_dp.models.builders import build_model, cfg_get, save_tokenizer
from nemo_dp.models.flat_grads import FlatGrads, make_adamw
from nemo_dp.models.policy.images import bind_images, generate_rows
from nemo_dp.models.precision import resolve_precision, warn_if_no_bf16
from nemo_dp.models.protocol import LossFn
from nemo_dp.models.token_ops import (
    first_logits_position,
    first_masked_columns,
    token_logprobs_from_logits,
)
from nemo_dp.utils.host_memory import reuse_freed_memory

__all__ = ["PolicyWorker", "configure_worker_process"]

# Metrics that are per-row counts (summed, not averaged, when aggregated).
COUNT_METRICS: frozenset[str] = frozenset({"num_valid_tokens", "num_valid_seqs"})


#: Legal values of ``policy.device``.
DEVICES: tuple[str, ...] = ("cpu", "cuda")


def _to_cpu(obj: Any) -> Any:
    """Every tensor of a nested state detached and on the CPU: views, not copies (Ray copies the state on return)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return copy.deepcopy(obj)


def resolve_device(policy_cfg: Any) -> torch.device:
    """The device ``policy.device`` names (default ``cpu``); ``RuntimeError`` for ``cuda`` without one."""
    name = str(cfg_get(policy_cfg, "device", "cpu"))
    if name not in DEVICES:
        raise ValueError(f"policy.device: got {name!r}; legal values: {list(DEVICES)}")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "policy.device=cuda but this worker sees no CUDA device; set policy.device=cpu or run "
            "on a GPU node (the workers need a GPU each)"
        )
    return torch.device(name)


def configure_worker_process(policy_cfg: Any, torch_threads: int) -> None:
    """Set this worker process's torch (and OpenMP) threads, and keep its freed memory unless
    ``policy.reuse_host_memory`` is false."""
    torch.set_num_threads(torch_threads)
    os.environ["OMP_NUM_THREADS"] = str(torch_threads)
    if cfg_get(policy_cfg, "reuse_host_memory", True):
        reuse_freed_memory()


class PolicyWorker:
    """One DP rank: model replica, optimizer, frozen reference copy and process-group membership.

    Every rank initialises identical weights from ``seed``; its own RNG streams use ``seed + rank``.
    """

    def __init__(
        self, *, rank: int, world_size: int, policy_cfg: Any, vocab_size: int, pad_id: int, eos_id: int, seed: int
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.cfg = policy_cfg
        configure_worker_process(policy_cfg, int(cfg_get(policy_cfg, "torch_threads")))
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.seed = seed
        self.vocab_size = vocab_size
        self.device = resolve_device(policy_cfg)
        self.precision = resolve_precision(policy_cfg)
        if self.device.type == "cuda":
            warn_if_no_bf16(self.precision, "cuda")
        torch.manual_seed(seed + rank)
        self.model = self._build_model().to(self.device)
        self.reference_model = self._frozen_copy(self.model)
        self._set_phase(cfg_get(cfg_get(policy_cfg, "optimizer"), "lr"))
        self._step_state: dict[str, Any] | None = None
        self._group_ready = False
        self._tokenizer_files: dict[str, bytes] | None = None  # written once, on first export

    def _build_model(self) -> torch.nn.Module:
        """This worker's trainable model (the value worker wraps it in a value head)."""
        return build_model(self.cfg, vocab_size=self.vocab_size, seed=self.seed)

    def collective_address(self) -> tuple[str, int]:
        """Rendezvous ``(host, port)`` reachable by the other ranks (asked of rank 0 only)."""
        return node_ip_address(), find_free_port()

    def init_collective(self, host: str, port: int, timeout_s: float) -> None:
        """Join rank 0's rendezvous (all ranks concurrently); ``timeout_s`` bounds it and every collective."""
        dist.init_process_group(
            backend="nccl" if self.device.type == "cuda" else "gloo",
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self._group_ready = True

    def shutdown(self) -> None:
        """Leave the process group (idempotent)."""
        if self._group_ready and dist.is_initialized():
            dist.destroy_process_group()
        self._group_ready = False

    def _local_coords(self) -> dict[str, int]:
        # Pure data parallelism: no tensor/context/pipeline siblings, every rank is a leader.
        return {}

    def _all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            if t.device != self.device:  # NCCL reduces device tensors only
                moved = t.to(self.device)
                dist.all_reduce(moved, op=dist.ReduceOp.SUM)
                t.copy_(moved)
            else:
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    @staticmethod
    def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        """A fresh AdamW over ``self.model``, whose gradients it lays out in flat buffers."""
        o = cfg_get(self.cfg, "optimizer")
        self.flat_grads = FlatGrads(self.model.parameters())
        return make_adamw(
            list(self.model.parameters()),
            lr=lr,
            betas=(float(cfg_get(o, "beta1")), float(cfg_get(o, "beta2"))),
            eps=float(cfg_get(o, "eps")),
            weight_decay=float(cfg_get(o, "weight_decay")),
        )

    def _set_phase(self, lr: float, decay_steps: int | None = None, warmup_steps: int | None = None) -> None:
        """A fresh optimizer at ``lr`` and step 0; ``warmup_steps`` None means the config's."""
        self.lr = float(lr)
        self.optimizer = self._make_optimizer(self.lr)
        self.optimizer_steps = 0
        self.decay_steps = None if decay_steps is None else int(decay_steps)
        if warmup_steps is None:
            warmup_steps = cfg_get(cfg_get(self.cfg, "optimizer"), "warmup_steps")
        self.warmup_steps = int(warmup_steps)

    def _current_lr(self) -> float:
        o = cfg_get(self.cfg, "optimizer")
        warmup = self.warmup_steps
        step = self.optimizer_steps + 1
        if warmup > 0 and step <= warmup:
            return self.lr * step / warmup
        if str(cfg_get(o, "schedule")) == "cosine" and self.decay_steps is not None:
            span = max(1, self.decay_steps - max(warmup, 0))
            progress = min(1.0, max(0.0, (step - max(warmup, 0)) / span))
            floor = float(cfg_get(o, "min_lr_ratio"))
            return self.lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))
        return self.lr

    def _forward(
        self, model: torch.nn.Module, input_ids: torch.Tensor, mb: BatchedDataDict | None = None, logits_from: int = 0
    ) -> torch.Tensor:
        """``model(input_ids, logits_from)`` under ``policy.precision``'s autocast, ``mb``'s images bound first.

        The caller's log-softmax and loss run in float32.
        """
        if mb is not None:
            model = bind_images(model, mb)
        with self.precision.autocast(self.device):
            return model(input_ids, logits_from=logits_from) if logits_from else model(input_ids)

    def _training_forward(
        self, loss_fn: LossFn, tensors: Mapping[str, torch.Tensor], mb: BatchedDataDict
    ) -> torch.Tensor:
        """The logits the loss reads (see ``LossFn``), under ``policy.train_attn_implementation`` when set."""
        logits_from = 0
        if getattr(loss_fn, "reads_masked_logprobs_only", False) and "token_mask" in tensors:
            logits_from = first_logits_position(tensors["token_mask"])
        impl = cfg_get(self.cfg, "train_attn_implementation", None)
        use_impl = impl and hasattr(self.model, "attention_implementation")
        with self.model.attention_implementation(str(impl)) if use_impl else contextlib.nullcontext():
            return self._forward(self.model, tensors["input_ids"], mb, logits_from)

    def _trim(self, mb: BatchedDataDict, width: int) -> dict[str, torch.Tensor]:
        """Tensor fields of a microbatch on the model's device, per-token ones narrowed to ``width`` columns."""
        out: dict[str, torch.Tensor] = {}
        for k, v in mb.items():
            if not isinstance(v, torch.Tensor) or v.is_nested:
                continue
            out[k] = (v[:, :width] if v.dim() >= 2 and v.shape[1] > width else v).to(self.device)
        return out

    def _micro_batches(self, data: BatchedDataDict, mbs: int) -> Iterator[tuple[MicrobatchSpec, BatchedDataDict, int]]:
        """``(spec, micro-batch, width)`` per the attached plan or runs of ``mbs`` rows (width >= the longest row)."""
        if data.micro_batch_indices is not None:
            specs = data.microbatch_plan()
        else:
            n = data.size
            if n < 1:
                raise ValueError(
                    f"PolicyWorker[{self.rank}]: shard of {n} rows is not a whole number of "
                    f"{n}-row global-batch parts"
                )
            specs = [MicrobatchSpec(0, s, min(s + mbs, n), None) for s in range(0, n, mbs)]
        dynamic = data.micro_batch_indices is not None and data.elem_counts_per_gb is None
        for spec in specs:
            mb = data.slice(spec.start, spec.end)
            width = int(mb["input_lengths"].max())
            if dynamic and spec.padded_length is not None:
                width = max(int(spec.padded_length), width)
            yield spec, mb, width

    def generate(self, shard: Mapping[str, Sequence[Any]], greedy: bool, return_images: bool = True) -> BatchedDataDict:
        """Generate this rank's ``{"prompts", "seeds"}`` shard as ``Policy.generate`` (empty without prompts)."""
        prompts, seeds = shard["prompts"], shard["seeds"]
        if len(prompts) != len(seeds):
            raise ValueError(f"PolicyWorker[{self.rank}].generate: {len(seeds)} seeds for {len(prompts)} prompts")
        if len(prompts) == 0:
            return BatchedDataDict()
        self.model.eval()
        return generate_rows(self, prompts, seeds, greedy=greedy, keep_images=return_images)

    @torch.no_grad()
    def _logprobs(self, model: torch.nn.Module, data: BatchedDataDict, micro_batch_size: int | None) -> torch.Tensor:
        model.eval()
        mbs = int(micro_batch_size or cfg_get(self.cfg, "logprob_batch_size"))
        out = torch.zeros((data.size, data["input_ids"].shape[1]), dtype=torch.float32)
        for spec, mb, w in self._micro_batches(data, mbs):
            ids = mb["input_ids"][:, :w].to(self.device)
            # Only masked tokens' log-probs are read downstream, so the LM head skips the prompt.
            mask = mb["token_mask"][:, :w] if "token_mask" in mb else None
            start = first_logits_position(mask) if mask is not None else 0
            lp = token_logprobs_from_logits(self._forward(model, ids, mb, start), ids).cpu()
            lengths = mb["input_lengths"].to(torch.long)
            cols = torch.arange(w).unsqueeze(0)
            valid = cols < lengths.unsqueeze(1)
            if mask is not None:
                # Per row, not per micro-batch, so the result does not depend on the batching.
                valid &= cols >= first_masked_columns(mask).unsqueeze(1)
            out[spec.start : spec.end, :w] = lp * valid
        return out

    def get_logprobs(self, data: BatchedDataDict, micro_batch_size: int | None = None) -> BatchedDataDict:
        """Per-token log-probs as ``Policy.get_logprobs`` (``micro_batch_size``: ``policy.logprob_batch_size``)."""
        return BatchedDataDict({"logprobs": self._logprobs(self.model, data, micro_batch_size)})

    def get_reference_policy_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None = None
    ) -> BatchedDataDict:
        """Like :meth:`get_logprobs` under the frozen reference policy, as ``{"reference_logprobs": ...}``."""
        return BatchedDataDict({"reference_logprobs": self._logprobs(self.reference_model, data, micro_batch_size)})

    def begin_train_step(self, loss_fn: LossFn, eval_mode: bool = False, mbs: int | None = None) -> None:
        """Start one optimizer step (``eval_mode``: loss only); ``RuntimeError`` (``"already active"``) during one."""
        if self._step_state is not None:
            raise RuntimeError(
                f"PolicyWorker[{self.rank}]: a train step is already active; finish or abort it first"
            )
        self.model.train(not eval_mode)
        self.optimizer.zero_grad(set_to_none=False)
        mbs = mbs or cfg_get(self.cfg, "train_micro_batch_size")
        self._step_state = {
            "loss_fn": loss_fn,
            "eval_mode": eval_mode,
            "mbs": None if mbs is None else int(mbs),
            "metrics": {},
            "rows": 0,
        }

    def train_microbatch(self, data: BatchedDataDict) -> None:
        """Forward/backward this rank's whole part of the current global batch.

        All ranks call this once per step, in lockstep: the valid token/sequence counts are
        all-reduced first so every microbatch loss is normalised by the global counts.
        """
        state = self._step_state
        if state is None:
            raise RuntimeError(f"PolicyWorker[{self.rank}]: train_microbatch called without begin_train_step")
        tm = data["token_mask"].float() * data["sample_mask"].float().unsqueeze(1)
        counts = torch.tensor([float(tm.sum()), float((tm.sum(1) > 0).float().sum())], dtype=torch.float64)
        self._all_reduce_sum(counts)
        global_tokens, global_seqs = float(counts[0]), float(counts[1])
        state["rows"] += data.size
        if global_tokens <= 0:
            # Nothing to learn from in the whole global batch (e.g. every row masked out).
            state["skipped"] = True
            return
        loss_fn = state["loss_fn"]
        metrics: dict[str, float] = state["metrics"]
        # No micro-batch size (policy.train_micro_batch_size: null): the whole part in one pass.
        for _, mb, width in self._micro_batches(data, state["mbs"] or max(data.size, 1)):
            tensors = self._trim(mb, width)
            with torch.no_grad() if state["eval_mode"] else contextlib.nullcontext():
                logits = self._training_forward(loss_fn, tensors, mb)
                loss, m = loss_fn(logits, tensors, global_tokens, global_seqs)
            if not state["eval_mode"]:
                loss.backward()
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + float(v)

    def finish_train_step(self) -> dict[str, Any]:
        """All-reduce gradients, clip, step the optimizer and end the step.

        Returns this rank's metric shares (summed over its microbatches), ``grad_norm``, ``lr``,
        ``skipped`` and ``is_replica_leader``.
        """
        state = self._step_state
        if state is None:
            raise RuntimeError(f"PolicyWorker[{self.rank}]: finish_train_step without begin_train_step")
        try:
            result: dict[str, Any] = dict(state["metrics"])
            skipped = bool(state.get("skipped", False))
            grad_norm = 0.0
            lr = self._current_lr()
            if not state["eval_mode"] and not skipped:
                self.flat_grads.all_reduce(self._all_reduce_sum)
                params = self.flat_grads.params
                max_norm = float(cfg_get(self.cfg, "max_grad_norm"))
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.optimizer.step()
                self.optimizer_steps += 1
            self.optimizer.zero_grad(set_to_none=False)
            result.update({"grad_norm": grad_norm, "lr": lr, "skipped": skipped, "is_replica_leader": True})
            return result
        finally:
            self._step_state = None

    def abort_train_step(self) -> None:
        """Drop accumulated gradients and end the step (idempotent)."""
        self.optimizer.zero_grad(set_to_none=False)
        self._step_state = None

    def train(self, data: BatchedDataDict, loss_fn: LossFn, eval_mode: bool = False, gbs: int | None = None,
              mbs: int | None = None) -> dict[str, Any]:
        """Train on this rank's parts of consecutive global batches; ``{"per_step": [finish_train_step metrics]}``.

        Arguments as ``Policy.train``.  Raises ``ValueError`` when the shard is not a whole number of parts.
        """
        gbs = int(gbs or cfg_get(self.cfg, "train_global_batch_size"))
        if gbs % self.world_size != 0:
            raise ValueError(f"PolicyWorker: gbs={gbs} is not a multiple of world_size={self.world_size}")
        chunk_rows = gbs // self.world_size
        # Row ranges of each chunk in this shard: from the plan when attached, else fixed.
        if data.micro_batch_indices is not None:
            chunks: dict[int, list[int]] = {}
            for spec in data.microbatch_plan():
                lo_hi = chunks.setdefault(spec.chunk, [spec.start, spec.end])
                lo_hi[0], lo_hi[1] = min(lo_hi[0], spec.start), max(lo_hi[1], spec.end)
            ranges = [(chunks[c][0], chunks[c][1], c) for c in sorted(chunks)]
        else:
            if data.size % chunk_rows != 0:
                raise ValueError(
                    f"PolicyWorker[{self.rank}]: shard of {data.size} rows is not a whole number of "
                    f"gbs/world_size = {chunk_rows}-row parts"
                )
            ranges = [(s, s + chunk_rows, None) for s in range(0, data.size, chunk_rows)]
        per_step = []
        for start, end, chunk in ranges:
            part = data.slice(start, end)
            if chunk is not None:
                part.micro_batch_indices = [data.micro_batch_indices[chunk]]  # type: ignore[index]
                part.micro_batch_lengths = [data.micro_batch_lengths[chunk]]  # type: ignore[index]
                if data.elem_counts_per_gb is not None:
                    part.elem_counts_per_gb = [data.elem_counts_per_gb[chunk]]
            self.begin_train_step(loss_fn, eval_mode=eval_mode, mbs=mbs)
            try:
                self.train_microbatch(part)
            except BaseException:
                self.abort_train_step()
                raise
            per_step.append(self.finish_train_step())
        return {"per_step": per_step}

    def snapshot_reference_policy(self) -> None:
        """Make the reference policy a frozen copy of the current weights."""
        self.reference_model = self._frozen_copy(self.model)

    def reset_optimizer(self, lr: float, decay_steps: int | None = None, warmup_steps: int | None = None) -> None:
        """Fresh optimizer state for a new phase (arguments as ``Policy.reset_optimizer``)."""
        self._set_phase(lr, decay_steps, warmup_steps)

    def get_state(self, include_weights: bool) -> dict[str, Any]:
        """``{"rng", "rank"}`` of this rank, with ``include_weights`` also the weights, optimizer and phase.

        ``pretrained`` holds the ``save_pretrained`` files (``{name: bytes}``) of a loadable model directory.
        """
        from nemo_dp.utils.checkpoint import PRETRAINED_KEY
        from nemo_dp.utils.seeding import capture_rng_state

        state: dict[str, Any] = {"rank": self.rank, "rng": capture_rng_state()}
        if include_weights:
            state.update(
                {
                    PRETRAINED_KEY: self._pretrained_files(),
                    "model": _to_cpu(dict(self.model.state_dict())),
                    "reference_model": _to_cpu(dict(self.reference_model.state_dict())),
                    "optimizer": _to_cpu(self.optimizer.state_dict()),
                    "optimizer_steps": self.optimizer_steps,
                    "decay_steps": self.decay_steps,
                    "warmup_steps": self.warmup_steps,
                    "lr": self.lr,
                }
            )
        return state

    def _pretrained_files(self) -> dict[str, bytes]:
        """The model's ``save_pretrained`` output plus its tokenizer's files (read once), name -> bytes."""
        if self._tokenizer_files is None:
            with tempfile.TemporaryDirectory(prefix="nemo_dp_tokenizer_") as tmp:
                save_tokenizer(self.cfg, tmp)
                self._tokenizer_files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
        with tempfile.TemporaryDirectory(prefix="nemo_dp_export_") as tmp:
            self.model.save_pretrained(tmp)
            model_files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
        # On a name both write, the model's own file wins (it is what from_pretrained reads).
        return {**self._tokenizer_files, **model_files}

    def load_state(self, weights: Mapping[str, Any], rng: Mapping[str, Any] | None) -> None:
        """Restore rank 0's ``get_state(include_weights=True)`` and this rank's ``rng`` (None keeps the streams)."""
        from nemo_dp.utils.seeding import restore_rng_state

        self.model.load_state_dict(weights["model"])
        self.reference_model.load_state_dict(weights["reference_model"])
        # Checkpoints written before the phase's warm-up was recorded used the config's.
        self._set_phase(weights["lr"], weights["decay_steps"], weights.get("warmup_steps"))
        self.optimizer.load_state_dict(weights["optimizer"])
        self.optimizer_steps = int(weights["optimizer_steps"])
        if rng is not None:
            restore_rng_state(dict(rng))

    def weights_digest(self) -> str:
        """Hex sha256 over the state dict's names, dtypes, shapes and bytes (bit-exact comparison)."""
        h = hashlib.sha256()
        state = self.model.state_dict()
        for name in sorted(state):
            t = state[name].detach().contiguous().cpu()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def weights_checksum(self) -> float:
        """Sum of all parameters in float64 (to check that replicas agree)."""
        return float(sum(p.detach().double().sum() for p in self.model.parameters()))
