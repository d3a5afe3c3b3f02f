"""Evaluate a checkpoint: ``python launchers/evaluate.py checkpoint=<run dir> [step=N]``.

Greedy held-out exact-match accuracy on the trainer's validation problems or ``eval.jsonl=<file>``,
in this process (no Ray, no data plane).
"""

from __future__ import annotations

import sys
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[1]
if str(_REPO_ROOT) not in sys.path:  # running from a checkout without an installed package
    sys.path.insert(0, str(_REPO_ROOT))

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from nemo_dp.training.hydra_task import hydra_task  # noqa: E402
from nemo_dp.training.run_record import RunRecord  # noqa: E402
from nemo_dp.training.evaluate import EvaluateConfig  # noqa: E402

CONF_DIR = _REPO_ROOT / "conf"

ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Validate the config, locate the checkpoint, evaluate into ``out_dir``; ``evaluate_checkpoint``'s dict."""
    import torch

    from nemo_dp.training.evaluate import evaluate_checkpoint, resolve_checkpoint

    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ValueError(f"{missing[0]}: required value is missing (python launchers/evaluate.py checkpoint=<run dir>)")
    options: EvaluateConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    torch.set_num_threads(options.torch_threads)
    ref = resolve_checkpoint(
        options.checkpoint, step=options.step, phase=options.phase, run_overrides=options.run_overrides
    )
    print(f"checkpoint: {ref.path} (phase {ref.phase}, step {ref.step}; run {ref.run_dir})", flush=True)
    result = evaluate_checkpoint(ref, options.eval, out_dir, progress_bar=options.progress_bar)
    print(
        f"Held-out exact-match accuracy of {ref.phase} step {ref.step}: {result['accuracy']:.3f} "
        f"({result['num_problems']} problems, {result['source']})",
        flush=True,
    )
    print(f"predictions: {result['predictions']}", flush=True)
    return result


@hydra.main(config_path=str(CONF_DIR), config_name="evaluate", version_base=None)
@hydra_task
def main(cfg: DictConfig, record: RunRecord) -> float:
    """Hydra entry point; returns the accuracy (a sweeper's objective)."""
    return float(run(cfg, record.run_dir)["accuracy"])


if __name__ == "__main__":
    main()
