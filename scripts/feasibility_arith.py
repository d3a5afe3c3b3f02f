"""Feasibility study: can SFT and GRPO on the arithmetic task learn on one CPU thread fast?

Runs, in one process with ``torch.set_num_threads(1)``, (1) SFT of a TinyCausalLM on 2-digit
addition until held-out greedy exact-match accuracy crosses a target, and (2) a short SFT warm
start followed by GRPO (group-relative advantages, clipped PG loss, k3 KL to the warm start),
reporting held-out accuracy and wall time along the way. Its numbers fix the default
hyperparameters of the SFT and GRPO configs.

Usage: python scripts/feasibility_arith.py sft|grpo [--flags]
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from nemo_dp.algorithms.advantages import grpo_advantages, grpo_baseline_and_std
from nemo_dp.algorithms.loss_functions import (
    ClippedPGLossFn,
    NLLLoss,
    global_valid_counts,
    token_logprobs_from_logits,
)
from nemo_dp.data.arithmetic import ArithmeticTask, Problem
from nemo_dp.data.tokenizer import CharTokenizer
from nemo_dp.models.generation import generate
from nemo_dp.models.model import ModelConfig, TinyCausalLM

TOK = CharTokenizer()


def sft_batch(problems: list[Problem]) -> dict[str, torch.Tensor]:
    """Right-padded SFT tensors: [bos] + prompt + answer + [eos], token_mask on the answer."""
    seqs, masks = [], []
    for p in problems:
        pr, rs = TOK.encode_prompt(p.prompt), TOK.encode_response(p.answer)
        seqs.append(pr + rs)
        masks.append([0] * len(pr) + [1] * len(rs))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), TOK.pad_id, dtype=torch.long)
    tm = torch.zeros((len(seqs), width), dtype=torch.int32)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        tm[i, : len(m)] = torch.tensor(m, dtype=torch.int32)
    return {"input_ids": ids, "token_mask": tm, "sample_mask": torch.ones(len(seqs))}


def evaluate(model: TinyCausalLM, problems: list[Problem], max_new_tokens: int) -> float:
    """Greedy exact-match accuracy."""
    out = generate(
        model, [TOK.encode_prompt(p.prompt) for p in problems], max_new_tokens=max_new_tokens,
        eos_id=TOK.eos_id, pad_id=TOK.pad_id, greedy=True, temperature=1.0, seeds=[0] * len(problems),
    )
    correct = 0
    for i, p in enumerate(problems):
        pl, L = int(out["prompt_lengths"][i]), int(out["input_lengths"][i])
        correct += TOK.decode(out["input_ids"][i, pl:L].tolist()) == p.answer
    return correct / len(problems)


def run_sft(model: TinyCausalLM, args: argparse.Namespace, train: list[Problem], evals: list[Problem],
            steps: int, t0: float, c0: float, log: list[dict]) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=args.wd)
    loss_fn = NLLLoss()
    gen = torch.Generator().manual_seed(args.seed)
    for step in range(1, steps + 1):
        lr = args.lr * min(1.0, step / args.warmup)
        if args.cosine:
            lr *= 0.5 * (1 + torch.cos(torch.tensor(torch.pi * step / steps))).item() * 0.9 + 0.1
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(len(train), (args.batch_size,), generator=gen).tolist()
        b = sft_batch([train[i] for i in idx])
        tokens, seqs = global_valid_counts(b["token_mask"], b["sample_mask"])
        loss, _ = loss_fn(model(b["input_ids"]), b, tokens, seqs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0 or step == steps:
            acc = evaluate(model, evals, args.max_new_tokens)
            rec = {"phase": "sft", "step": step, "loss": round(float(loss.detach()), 4), "acc": acc,
                   "t": round(time.time() - t0, 1),
                   "cpu": round(time.process_time() - c0, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
            if args.stop_acc and acc >= args.stop_acc:
                return


def run_grpo(model: TinyCausalLM, args: argparse.Namespace, train: list[Problem], evals: list[Problem],
             t0: float, c0: float, log: list[dict]) -> None:
    ref = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=args.grpo_lr, betas=(0.9, args.grpo_beta2), weight_decay=0.0)
    loss_fn = ClippedPGLossFn(0.2, 0.2, args.kl, token_level_loss=True)
    gen = torch.Generator().manual_seed(args.seed + 1)
    g = args.group_size
    for step in range(1, args.grpo_steps + 1):
        for group in opt.param_groups:
            group["lr"] = args.grpo_lr * min(1.0, step / args.grpo_warmup)
        idx = torch.randint(len(train), (args.prompts_per_step,), generator=gen).tolist()
        probs = [train[i] for i in idx for _ in range(g)]
        seeds = [step * 100_000 + j for j in range(len(probs))]
        out = generate(model, [TOK.encode_prompt(p.prompt) for p in probs], max_new_tokens=args.max_new_tokens,
                       eos_id=TOK.eos_id, pad_id=TOK.pad_id, greedy=False, temperature=1.0, seeds=seeds)
        resp = [TOK.decode(out["input_ids"][i, int(out["prompt_lengths"][i]): int(out["input_lengths"][i])].tolist())
                for i in range(len(probs))]
        rewards = torch.tensor([float(r == p.answer) for r, p in zip(resp, probs)])
        base, std = grpo_baseline_and_std(rewards, g, leave_one_out=True)
        adv = grpo_advantages(rewards, base, std, normalize_std=True)
        b = {"input_ids": out["input_ids"], "token_mask": out["token_mask"],
             "sample_mask": torch.ones(len(probs)),
             "advantages": adv.unsqueeze(1) * out["token_mask"].float()}
        with torch.no_grad():
            b["prev_logprobs"] = token_logprobs_from_logits(model(b["input_ids"]), b["input_ids"])
            b["reference_policy_logprobs"] = token_logprobs_from_logits(ref(b["input_ids"]), b["input_ids"])
        tokens, seqs = global_valid_counts(b["token_mask"], b["sample_mask"])
        loss, m = loss_fn(model(b["input_ids"]), b, tokens, seqs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.grpo_eval_every == 0 or step == args.grpo_steps:
            acc = evaluate(model, evals, args.max_new_tokens)
            rec = {"phase": "grpo", "step": step, "reward": round(float(rewards.mean()), 3), "acc": acc,
                   "kl": round(m["kl_penalty"], 4), "special": sum("<" in r for r in resp), "t": round(time.time() - t0, 1),
                   "cpu": round(time.process_time() - c0, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["sft", "grpo"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--digits", type=int, default=2)
    ap.add_argument("--n_train", type=int, default=8000)
    ap.add_argument("--n_eval", type=int, default=200)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d_model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--cosine", action="store_true")
    ap.add_argument("--batch_size", type=int, default=128)
    ap.add_argument("--sft_steps", type=int, default=1500)
    ap.add_argument("--eval_every", type=int, default=100)
    ap.add_argument("--stop_acc", type=float, default=0.0)
    ap.add_argument("--max_new_tokens", type=int, default=5)
    ap.add_argument("--grpo_steps", type=int, default=100)
    ap.add_argument("--grpo_lr", type=float, default=1e-3)
    ap.add_argument("--kl", type=float, default=0.01)
    ap.add_argument("--grpo_warmup", type=int, default=1)
    ap.add_argument("--grpo_beta2", type=float, default=0.98)
    ap.add_argument("--save_warm", default="")
    ap.add_argument("--load_warm", default="")
    ap.add_argument("--group_size", type=int, default=8)
    ap.add_argument("--prompts_per_step", type=int, default=32)
    ap.add_argument("--grpo_eval_every", type=int, default=10)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    task = ArithmeticTask(args.digits, ("+",), seed=args.seed)
    train, evals = task.train_problems(args.n_train), task.eval_problems(args.n_eval)
    cfg = ModelConfig(vocab_size=TOK.vocab_size, n_layers=args.layers, d_model=args.d_model,
                      n_heads=args.heads, max_seq_len=3 + 2 * args.digits + 2 * args.digits + 1 + 2)
    model = TinyCausalLM(cfg, seed=args.seed)
    print(f"params={sum(p.numel() for p in model.parameters())} cfg={cfg}", flush=True)
    t0 = time.time()
    log: list[dict] = []
    if args.load_warm:
        model.load_state_dict(torch.load(args.load_warm))
        print(json.dumps({"phase": "warm", "acc": evaluate(model, evals, args.max_new_tokens)}), flush=True)
    else:
        run_sft(model, args, train, evals, args.sft_steps, t0, time.process_time(), log)
    if args.save_warm:
        torch.save(model.state_dict(), args.save_warm)
    if args.mode == "grpo":
        t1 = time.time()
        run_grpo(model, args, train, evals, t1, time.process_time(), log)
    print("DONE", json.dumps(vars(args)), flush=True)


if __name__ == "__main__":
    main()
