"""Exact resume of a VLM SFT run (``policy=hf_vlm env=visual``) on the TransferQueue data plane.

A straight 2-step run checkpointing every step versus a run resumed from its step-1 checkpoint:
step 2 must log the same metrics (``==``) and both runs' step-2 checkpoints must hold the same
weights (the saved model tensors compared exactly).  Both are real launcher runs
(``test_sft_parity.run_launcher``) on the tiny Qwen2-VL, whose rows carry images in the store.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.test_sft_parity import COMPARED, read_metrics, run_launcher

VLM_SFT: tuple[str, ...] = (
    "~recipe",
    "algorithm=sft",
    "policy=hf_vlm",
    "env=visual",
    "data_plane=tq",
    "seed=3",
    "policy.dp_size=2",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "policy.optimizer.warmup_steps=0",
    "policy.optimizer.lr=1.0e-2",
    "algorithm.max_steps=2",
    "algorithm.num_train_samples=32",
    "algorithm.val_samples=4",
    "algorithm.val_period=0",
    "checkpointing.enabled=true",
    "checkpointing.save_period=1",
    "checkpointing.keep_last=2",
    "logger.plot=false",
    "logger.progress_bar=false",
)


def _weights(step_dir: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    files = sorted(step_dir.rglob("*.safetensors"))
    assert files, f"no *.safetensors under {step_dir}"
    out: dict[str, object] = {}
    for f in files:
        for name, tensor in load_file(str(f)).items():
            out[f"{f.relative_to(step_dir)}:{name}"] = tensor
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_vlm_sft_resume_is_exact(tmp_path: Path) -> None:
    from nemo_dp.models.hf.make_tiny_vlm import ensure_tiny_vlm_checkpoint

    model = ensure_tiny_vlm_checkpoint(tmp_path / "vlm")
    base = [*VLM_SFT, f"policy.model_name_or_path={model}"]
    straight = tmp_path / "straight"
    run_launcher([*base, f"hydra.run.dir={straight}"], tmp_path)
    ckpts = straight / "checkpoints" / "sft"
    root = tmp_path / "resume_root"
    shutil.copytree(ckpts / "step_00000001", root / "sft" / "step_00000001")
    resumed = tmp_path / "resumed"
    proc = run_launcher([*base, f"checkpointing.resume_from={root}", f"hydra.run.dir={resumed}"], tmp_path)
    assert "resumed from" in proc.stdout and "at step 1" in proc.stdout

    a, b = read_metrics(straight), read_metrics(resumed)
    assert sorted(b) == [2]
    assert {k: b[2][k] for k in COMPARED} == {k: a[2][k] for k in COMPARED}
    wa = _weights(ckpts / "step_00000002")
    wb = _weights(resumed / "checkpoints" / "sft" / "step_00000002")
    assert sorted(wa) == sorted(wb)
    for name, tensor in wa.items():
        assert tensor.dtype == wb[name].dtype and tensor.equal(wb[name]), name
    # Not trivial: step 2 moved the model's weights.
    w1 = _weights(ckpts / "step_00000001")
    model = [n for n in wa if n.startswith("policy/model.safetensors:")]
    assert model and any(not wa[n].equal(w1[n]) for n in model)
