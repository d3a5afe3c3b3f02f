"""The built-in visual task (``env=visual``) as the trainers' datasets, and its check before Ray.

Rows are ``VisualSFTExample`` / ``VisualProblem`` drawn from ``VisualTask(env.visual_kind,
env.seed)``; a row carries its rendering spec, and the workers render and encode the images.
:func:`validate_visual_datasets` checks on the driver that the policy reads images and that the
longest prompt and SFT example fit ``policy.model.max_seq_len``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from nemo_dp.data.errors import DatasetError
from nemo_dp.data.visual_task import KINDS, VisualProblem, VisualSFTExample, VisualTask

__all__ = [
    "VISUAL_SOURCE_LABEL",
    "is_visual_env",
    "visual_task",
    "visual_sft_rows",
    "visual_rl_rows",
    "visual_val_rows",
    "validate_visual_datasets",
]

#: How messages name the generator.
VISUAL_SOURCE_LABEL = "the built-in visual task"
_MAX_SEQ_LEN_KEY = "policy.model.max_seq_len"
_NEW_TOKENS_KEY = "policy.generation.max_new_tokens"


def is_visual_env(env_cfg: Any) -> bool:
    """Whether ``env_cfg`` selects the built-in visual task (``env.name == "visual"``)."""
    return str(getattr(env_cfg, "name", "arithmetic")) == "visual"


@lru_cache(maxsize=8)
def _task(kind: str, seed: int) -> VisualTask:
    return VisualTask(kind, seed)


def visual_task(env_cfg: Any) -> VisualTask:
    """The task ``env`` describes (``env.visual_kind``, ``env.seed``).

    Raises:
        DatasetError: An unknown ``env.visual_kind`` (naming the legal values).
    """
    kind = str(getattr(env_cfg, "visual_kind", "digit"))
    if kind not in KINDS:
        raise DatasetError(f"unknown visual task {kind!r}; legal values: {list(KINDS)}", key="env.visual_kind")
    return _task(kind, int(env_cfg.seed))


def _draw(draw: Any, n: int, key: str) -> list[VisualProblem]:
    try:
        return draw(int(n))
    except ValueError as exc:
        raise DatasetError(str(exc), key=key, fix=f"lower {key}") from exc


def visual_sft_rows(env_cfg: Any, num_samples: int, *, num_samples_key: str) -> list[VisualSFTExample]:
    """``num_samples`` training problems as SFT examples (the response is the exact answer)."""
    problems = _draw(visual_task(env_cfg).train_problems, num_samples, num_samples_key)
    return [VisualSFTExample(p.prompt, p.answer) for p in problems]


def visual_rl_rows(env_cfg: Any, num_prompts: int, *, num_prompts_key: str) -> list[VisualProblem]:
    """``num_prompts`` training problems."""
    return _draw(visual_task(env_cfg).train_problems, num_prompts, num_prompts_key)


def visual_val_rows(env_cfg: Any, val_samples: int, *, val_samples_key: str) -> list[VisualProblem]:
    """``val_samples`` held-out problems (disjoint from every training draw)."""
    return _draw(visual_task(env_cfg).eval_problems, val_samples, val_samples_key)


def _longest_prompt(problems: list[VisualProblem], processor: Any) -> int:
    # A prompt's length depends only on its image's size and its question: encode one per size.
    by_shape: dict[tuple[int, int, str], VisualProblem] = {}
    for p in problems:
        by_shape.setdefault((p.spec[1], p.spec[2], p.question), p)
    return max(len(processor.encode_messages(p.prompt.messages()).input_ids) for p in by_shape.values())


def validate_visual_datasets(cfg: Any, tokenizer: Any) -> Any:
    """Check the visual task's datasets of every phase ``cfg`` (``env.name == "visual"``) runs; a ``DatasetReport``.

    A vision-language tokenizer (``policy=hf_vlm``) carries the image processor as ``.processor``.

    Raises:
        DatasetError: A data key is set (the task reads no file), the policy cannot read
            images, or a prompt / example does not fit
            ``policy.model.max_seq_len`` (naming the key to change).
    """
    from nemo_dp.data.validation import DatasetCheck, DatasetReport, get_dotted, sft_phases

    for name in ("sft_data", "rl_data", "val_data", "sft_jsonl", "rl_jsonl", "val_jsonl"):
        if getattr(cfg.env, name, None) is not None:
            raise DatasetError(
                "is set, but env=visual generates its own data and reads no file",
                key=f"env.{name}",
                fix="leave env at its default (env=arith) to train on your files with policy=hf_vlm",
            )
    processor = getattr(tokenizer, "processor", None)
    if processor is None:
        raise DatasetError(
            "the visual task needs a policy that reads images",
            key="env.name",
            fix="use policy=hf_vlm (a vision-language model), or an env with text prompts",
        )
    limit = int(cfg.policy.model.max_seq_len)
    new_tokens = int(cfg.policy.generation.max_new_tokens)
    env_cfg, algo = cfg.env, cfg.algorithm
    report = DatasetReport()

    def check(phase: str, role: str, key: str, problems: list[VisualProblem], extra: int, what: str) -> None:
        longest = _longest_prompt(problems, processor) + extra
        if longest > limit:
            raise DatasetError(
                f"a {what} has {longest} tokens > {_MAX_SEQ_LEN_KEY}={limit}",
                key=key,
                path=VISUAL_SOURCE_LABEL,
                fix=f"raise {_MAX_SEQ_LEN_KEY} to at least {longest}"
                + (f" or lower {_NEW_TOKENS_KEY}" if role != "sft" else ""),
            )
        report.checks.append(DatasetCheck(phase, role, key, VISUAL_SOURCE_LABEL, len(problems), longest, limit))

    task = visual_task(env_cfg)

    def sft_phase(phase: str, num_key: str, val_key: str) -> None:
        problems = _draw(task.train_problems, int(get_dotted(cfg, num_key)), num_key)
        # prompt + the answer's tokens + eos
        extra = max(len(tokenizer.encode(p.answer)) for p in problems) + 1
        check(phase, "train", num_key, problems, extra, "example")
        check(phase, "val", val_key, _draw(task.eval_problems, int(get_dotted(cfg, val_key)), val_key), new_tokens, "prompt")

    name = str(algo.name)
    if sft_phases(algo, sft_phase):
        return report
    problems = _draw(task.train_problems, int(algo.num_train_prompts), "algorithm.num_train_prompts")
    if len(problems) < int(algo.num_prompts_per_step):
        raise DatasetError(
            f"the generator yields {len(problems)} rows, fewer than algorithm.num_prompts_per_step="
            f"{int(algo.num_prompts_per_step)} (one batch)",
            key="algorithm.num_train_prompts",
            fix="raise algorithm.num_train_prompts",
        )
    check(name, "train", "algorithm.num_train_prompts", problems, new_tokens, "prompt")
    val_key = "algorithm.val_samples"
    check(name, "val", val_key, _draw(task.eval_problems, int(algo.val_samples), val_key), new_tokens, "prompt")
    return report
