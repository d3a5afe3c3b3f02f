"""Feasibility study: can SFT and GRPO on the arithmetic task learn on one CPU thread, fast?

Runs, in one process with ``torch.set_num_threads(1)`` (the real run has one thread per Ray
worker), with the library's own building blocks (tokenizer, task, EpochLoader, collate_sft,
TinyCausalLM, generate, NLLLoss, ClippedPGLossFn, GRPO advantages, ArithmeticEnv):

* ``sft``:  SFT on 2-digit addition, reporting held-out greedy exact-match accuracy and time;
* ``grpo``: a short SFT warm start, then GRPO (group-relative advantages with a leave-one-out
  baseline and std normalisation, clipped PG loss, k3 KL to the warm start as reference).

Its numbers fix the default hyperparameters of the SFT and GRPO configs (see
``Recommended defaults`` in the training-stack notes). Times are wall and process-CPU seconds
(CPU seconds are the better measure on a shared machine).

Usage: python scripts/feasibility_arith.py sft|grpo [--flags]   (defaults = recommended)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from typing import Any

import torch

from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std
from nemo_dp.algorithms.loss_functions import (
    ClippedPGLossFn,
    NLLLoss,
    global_valid_counts,
    token_logprobs_from_logits,
)
from nemo_dp.data.arithmetic import ArithmeticTask, Problem
from nemo_dp.data.datasets import EpochLoader, RLPromptDataset, SFTDataset, collate_sft
from nemo_dp.data.tokenizer import CharTokenizer
from nemo_dp.environments.arithmetic_env import ArithmeticEnv
from nemo_dp.models.generation import generate
from nemo_dp.models.tiny.model import ModelConfig, TinyCausalLM

TOK = CharTokenizer()
ENV = ArithmeticEnv()


class Clock:
    """Wall and process-CPU seconds since construction."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.time(), time.process_time()

    def stamp(self) -> dict[str, float]:
        return {"t": round(time.time() - self.wall, 1), "cpu": round(time.process_time() - self.cpu, 1)}


def responses(out: dict) -> list[str]:
    """Decoded response text of each generated row."""
    return [
        TOK.decode(out["input_ids"][i, int(out["prompt_lengths"][i]) : int(out["input_lengths"][i])].tolist())
        for i in range(out["input_ids"].shape[0])
    ]


def evaluate(model: TinyCausalLM, problems: list[Problem], max_new_tokens: int) -> float:
    """Held-out greedy exact-match accuracy."""
    out = generate(
        model, [TOK.encode_prompt(p.prompt) for p in problems], max_new_tokens=max_new_tokens,
        eos_id=TOK.eos_id, pad_id=TOK.pad_id, greedy=True, temperature=1.0, seeds=[0] * len(problems),
    )
    return float(ENV.score(responses(out), [p.answer for p in problems]).mean())


def lr_at(step: int, base: float, warmup: int, total: int, cosine: bool, min_ratio: float) -> float:
    """Linear warmup, then constant or cosine decay to ``min_ratio * base`` at ``total``."""
    lr = base * min(1.0, step / max(1, warmup))
    if cosine:
        progress = min(1.0, step / total)
        lr *= min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return lr


def optimizer_step(model: TinyCausalLM, opt: torch.optim.Optimizer, lr: float, loss_fn: Any, batch: dict[str, Any],
                   grad_clip: float) -> dict[str, Any]:
    """One step of ``opt`` at ``lr`` on ``loss_fn`` over ``batch``, gradients clipped to ``grad_clip``.

    Returns:
        The loss function's metrics.
    """
    for group in opt.param_groups:
        group["lr"] = lr
    tokens, seqs = global_valid_counts(batch["token_mask"], batch["sample_mask"])
    loss, metrics = loss_fn(model(batch["input_ids"]), batch, tokens, seqs)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return metrics


def run_sft(model: TinyCausalLM, args: argparse.Namespace, task: ArithmeticTask, evals: list[Problem],
            steps: int, cosine: bool, weight_decay: float) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    loader = EpochLoader(SFTDataset.from_arithmetic(task, args.n_train), args.batch_size, seed=args.seed)
    loss_fn, clock = NLLLoss(), Clock()
    for step in range(1, steps + 1):
        batch = collate_sft(loader.next_batch(), TOK)
        lr = lr_at(step, args.lr, args.warmup, steps, cosine, 0.1)
        metrics = optimizer_step(model, opt, lr, loss_fn, batch, args.grad_clip)
        if step % args.eval_every == 0 or step == steps:
            rec = {"phase": "sft", "step": step, "loss": round(metrics["loss"], 4),
                   "acc": evaluate(model, evals, args.max_new_tokens), **clock.stamp()}
            print(json.dumps(rec), flush=True)


def run_grpo(model: TinyCausalLM, args: argparse.Namespace, task: ArithmeticTask, evals: list[Problem]) -> None:
    ref = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=args.grpo_lr, betas=(0.9, 0.999), weight_decay=0.0)
    loss_fn = ClippedPGLossFn(0.2, 0.2, args.kl, token_level_loss=True)
    loader = EpochLoader(RLPromptDataset.from_arithmetic(task, args.n_train), args.prompts_per_step, seed=args.seed)
    g, clock = args.group_size, Clock()
    for step in range(1, args.grpo_steps + 1):
        problems = [p for p in loader.next_batch() for _ in range(g)]
        seeds = [args.seed * 10**9 + step * 10**5 + j for j in range(len(problems))]
        out = generate(model, [TOK.encode_prompt(p.prompt) for p in problems], max_new_tokens=args.max_new_tokens,
                       eos_id=TOK.eos_id, pad_id=TOK.pad_id, greedy=False, temperature=1.0, seeds=seeds)
        rewards = ENV.score(responses(out), [p.answer for p in problems])
        baseline, std = grpo_baseline_and_std(rewards, g, leave_one_out=True)
        adv = grpo_advantages(rewards, baseline, std, normalize_std=True)
        batch = {"input_ids": out["input_ids"], "token_mask": out["token_mask"],
                 "sample_mask": torch.ones(len(problems)),
                 "advantages": adv.unsqueeze(1) * out["token_mask"].float()}
        with torch.no_grad():
            batch["prev_logprobs"] = token_logprobs_from_logits(model(batch["input_ids"]), batch["input_ids"])
            batch["reference_policy_logprobs"] = token_logprobs_from_logits(ref(batch["input_ids"]), batch["input_ids"])
        lr = lr_at(step, args.grpo_lr, args.grpo_warmup, args.grpo_steps, False, 1.0)
        metrics = optimizer_step(model, opt, lr, loss_fn, batch, args.grad_clip)
        if step % args.grpo_eval_every == 0 or step == args.grpo_steps:
            rec = {"phase": "grpo", "step": step, "reward": round(float(rewards.mean()), 3),
                   "acc": evaluate(model, evals, args.max_new_tokens),
                   "kl": round(metrics["kl_penalty"], 4), **clock.stamp()}
            print(json.dumps(rec), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["sft", "grpo"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--digits", type=int, default=2)
    ap.add_argument("--n_train", type=int, default=8000)
    ap.add_argument("--n_eval", type=int, default=400)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d_model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--max_seq_len", type=int, default=16)
    ap.add_argument("--grad_clip", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight_decay", type=float, default=0.1, help="SFT AdamW weight decay")
    ap.add_argument("--warm_weight_decay", type=float, default=0.0, help="warm-start AdamW weight decay")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch_size", type=int, default=128)
    ap.add_argument("--sft_steps", type=int, default=1000, help="SFT steps (cosine decay to 0.1 lr)")
    ap.add_argument("--warm_steps", type=int, default=275, help="GRPO warm start SFT steps (constant lr)")
    ap.add_argument("--eval_every", type=int, default=100)
    ap.add_argument("--max_new_tokens", type=int, default=5)
    ap.add_argument("--grpo_steps", type=int, default=100)
    ap.add_argument("--grpo_lr", type=float, default=1e-4)
    ap.add_argument("--grpo_warmup", type=int, default=20)
    ap.add_argument("--kl", type=float, default=0.01)
    ap.add_argument("--group_size", type=int, default=8)
    ap.add_argument("--prompts_per_step", type=int, default=32)
    ap.add_argument("--grpo_eval_every", type=int, default=25)
    ap.add_argument("--save", default="", help="save the model after SFT / warm start here")
    ap.add_argument("--load", default="", help="skip SFT: load this warm start")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    task = ArithmeticTask(args.digits, ("+",), seed=args.seed)
    evals = task.eval_problems(args.n_eval)
    cfg = ModelConfig(vocab_size=TOK.vocab_size, n_layers=args.layers, d_model=args.d_model,
                      n_heads=args.heads, max_seq_len=args.max_seq_len)
    model = TinyCausalLM(cfg, seed=args.seed)
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()), **vars(args)}), flush=True)
    if args.load:
        model.load_state_dict(torch.load(args.load))
        print(json.dumps({"phase": "loaded", "acc": evaluate(model, evals, args.max_new_tokens)}), flush=True)
    elif args.mode == "sft":
        run_sft(model, args, task, evals, args.sft_steps, cosine=True, weight_decay=args.weight_decay)
    else:
        run_sft(model, args, task, evals, args.warm_steps, cosine=False, weight_decay=args.warm_weight_decay)
    if args.save:
        torch.save(model.state_dict(), args.save)
    if args.mode == "grpo":
        run_grpo(model, args, task, evals)


if __name__ == "__main__":
    main()
