"""The image-dataset runs of the VLM parity process: a user's image jsonl files and reward.

``write_dataset`` writes a few PNGs (the built-in visual task's renderer) and ``sft.jsonl`` /
``rl.jsonl`` / ``val.jsonl`` chat files whose image parts name them relative to the file, and
a user's reward function that checks each row's image path (``REWARD_FILE``).
``vlm_parity.py`` runs them with its own settings, ``env=visual`` replaced by
``data_overrides`` (``env.sft_data`` / ``env.rl_data`` / ``env.val_data`` and the reward):
VLM SFT (``SFT_RUNS``) on ``disabled`` and ``tq`` from the checkpoint's weights, then VLM GRPO
(``GRPO_RUNS``) on both from the legacy SFT's final policy state; each config goes through
``validate_datasets`` (the check before Ray) first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SFT_STEPS = 2
GRPO_STEPS = 2
NUM_ROWS = 8


#: The runs' reward function: mixed rewards from an untrained model (the response length's
#: parity), and a check that every scored row reaches it with its resolved image path.
REWARD_FILE = """
from pathlib import Path


def parity(completions, prompts, answer, **kwargs):
    for turns in prompts:
        image = turns[0]["content"][0]["image"]
        assert Path(image).is_absolute() and Path(image).is_file(), image
    return [float(len(c[0]["content"]) % 2) for c in completions]
"""


def write_dataset(data_dir: Path) -> dict[str, Path]:
    """PNGs under ``data_dir/imgs``, the SFT, RL and held-out jsonl files naming them, and the
    reward file.

    Returns:
        ``{"sft": path, "rl": path, "val": path, "reward": path}``.
    """
    from nemo_dp.data.visual_task import VisualTask

    (data_dir / "imgs").mkdir(parents=True, exist_ok=True)
    task = VisualTask("digit", seed=5)
    rows: dict[str, list[dict[str, Any]]] = {"sft": [], "rl": [], "val": []}
    for role, problems in (("rl", task.train_problems(NUM_ROWS)), ("val", task.eval_problems(4))):
        for i, p in enumerate(problems):
            name = f"imgs/{role}_{i}.png"
            p.image().save(data_dir / name)
            parts = [{"type": "image", "image": name}, {"type": "text", "text": p.question}]
            prompt = [{"role": "user", "content": parts}]
            rows[role].append({"messages": prompt, "answer": p.answer})
            if role == "rl":
                rows["sft"].append({"messages": [*prompt, {"role": "assistant", "content": p.answer}]})
    out = {"reward": data_dir / "reward.py"}
    out["reward"].write_text(REWARD_FILE, encoding="utf-8")
    for role, items in rows.items():
        out[role] = data_dir / f"{role}.jsonl"
        out[role].write_text("".join(json.dumps(r) + "\n" for r in items), encoding="utf-8")
    return out


def data_overrides(files: dict[str, Path]) -> tuple[str, ...]:
    """The dataset and reward keys that replace ``env=visual`` in the parity runs' settings."""
    return (
        f"env.sft_data={files['sft']}",
        f"env.rl_data={files['rl']}",
        f"env.val_data={files['val']}",
        f"env.reward={files['reward']}:parity",
        "algorithm.val_samples=4",
    )


SFT_RUNS: dict[str, tuple[str, ...]] = {
    f"sft_{dp}": ("algorithm=sft", f"data_plane={dp}", f"algorithm.max_steps={SFT_STEPS}", "policy.optimizer.lr=1.0e-2")
    for dp in ("disabled", "tq")
}
_GRPO: tuple[str, ...] = (
    "algorithm=grpo",
    f"algorithm.max_steps={GRPO_STEPS}",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=4",
    "algorithm.val_at_start=true",
    "algorithm.warm_start.enabled=false",
    "policy.optimizer.lr=1.0e-3",
)
GRPO_RUNS: dict[str, tuple[str, ...]] = {f"grpo_{dp}": (*_GRPO, f"data_plane={dp}") for dp in ("disabled", "tq")}

