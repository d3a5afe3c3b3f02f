"""Dataset problems surface on the driver before Ray starts, naming the config key, the
file:line and field, and the key to change (each case below used to fail only after Ray and
TransferQueue had started, or inside a worker, or without naming a key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from nemo_dp.config import CONF_DIR, RECIPES_DIR, register_configs, validate_config
from nemo_dp.config.schema import MasterConfig
from nemo_dp.data.errors import DatasetError
from nemo_dp.data.sources import build_val_problems
from nemo_dp.models.tiny.tokenizer import CharTokenizer
from nemo_dp.data.validation import validate_datasets
from tests.unit.test_chat_template import build_hf_tokenizer

DATA = Path(__file__).resolve().parents[1] / "data"
TOK = CharTokenizer()

register_configs()


def _compose(*overrides: str) -> DictConfig:
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        return compose("config", overrides=list(overrides))


def _cfg(*overrides: str) -> MasterConfig:
    return validate_config(_compose(*overrides))


def _jsonl(tmp_path: Path, rows: list[object], name: str = "data.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


SFT = ("~recipe", "algorithm=sft", "data_plane=local", "policy.train_global_batch_size=4")
GRPO = ("~recipe", "algorithm=grpo", "algorithm.num_prompts_per_step=4", "policy.train_global_batch_size=32")


def _train_dataset(cfg: object, tokenizer: object) -> object:
    """The training dataset the run builds: the algorithm's registered input builder's."""
    from nemo_dp.config.algorithm_registry import algorithm
    from nemo_dp.utils.imports import resolve_target

    builder = resolve_target(algorithm(str(cfg.algorithm.name)).input_builder)
    return builder(cfg, tokenizer).train_loader.dataset


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_recipe_and_the_default_pass(recipe: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    cfg = _cfg(f"recipe={recipe}")
    tok = TOK
    if cfg.policy.kind == "hf_vlm":
        # A recipe for the vision-language policy is checked with its own tokenizer (it carries
        # the image processor), built from a tiny Qwen2-VL like the recipe's default model.
        from nemo_dp.models.builders import build_tokenizer
        from nemo_dp.models.hf.make_tiny_vlm import ensure_tiny_vlm_checkpoint

        model_dir = ensure_tiny_vlm_checkpoint(tmp_path_factory.mktemp("vlm"))
        cfg = _cfg(f"recipe={recipe}", f"policy.model_name_or_path={model_dir}")
        tok = build_tokenizer(cfg.policy)
    report = validate_datasets(cfg, tok)
    assert report.checks and all(c.longest <= c.limit for c in report.checks)
    assert {c.role for c in report.checks} == {"train", "val"}


def test_default_grpo_with_warm_start_checks_every_phase() -> None:
    cfg = _cfg("~recipe", "algorithm.warm_start.enabled=true")
    report = validate_datasets(cfg, TOK)
    assert [(c.phase, c.role, c.key) for c in report.checks] == [
        ("warm_start", "train", "algorithm.warm_start.num_train_samples"),
        ("warm_start", "val", "algorithm.warm_start.val_samples"),
        ("grpo", "train", "algorithm.num_train_prompts"),
        ("grpo", "val", "algorithm.val_samples"),
    ]
    assert [c.rows for c in report.checks] == [2000, 100, 2000, 100]
    # bos + "dd+dd=" + 6 new tokens; a DictConfig works as well as the dataclasses.
    assert report.checks[2].longest == 13 and report.checks[2].limit == 32
    assert validate_datasets(_compose("~recipe", "algorithm.warm_start.enabled=true"), TOK) == report


def test_missing_sft_file_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"^env.sft_jsonl: .*missing.jsonl: file does not exist") as info:
        validate_datasets(_cfg(*SFT, f"env.sft_jsonl={tmp_path}/missing.jsonl"), TOK)
    assert info.value.key == "env.sft_jsonl"


def test_missing_warm_start_file_of_a_grpo_run_names_the_key(tmp_path: Path) -> None:
    cfg = _cfg(*GRPO, "algorithm.warm_start.enabled=true", f"env.sft_jsonl={tmp_path}/nope.jsonl")
    with pytest.raises(DatasetError, match=r"^env.sft_jsonl: .*nope.jsonl: file does not exist"):
        validate_datasets(cfg, TOK)


def test_out_of_vocabulary_character_names_file_line_and_field(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        [{"prompt": "1+1=", "response": "2"}] * 4
        + [{"messages": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "vier – 4"}]}],
    )
    with pytest.raises(DatasetError) as info:
        validate_datasets(_cfg(*SFT, f"env.sft_jsonl={path}"), TOK)
    err = info.value
    assert (err.key, err.path, err.line, err.field) == ("env.sft_jsonl", path, 5, "messages[1].content")
    assert str(err) == (
        f"env.sft_jsonl: {path}:5: field 'messages[1].content' holds character '–', which the tokenizer "
        "cannot encode; remove it from the data or use a tokenizer whose vocabulary has it"
    )


def test_out_of_vocabulary_rl_prompt(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"prompt": "1+1=", "answer": "2"}] * 4 + [{"prompt": "1×1=", "answer": "1"}])
    with pytest.raises(DatasetError, match=rf"^env.rl_jsonl: {path}:5: field 'prompt' holds character '×'"):
        validate_datasets(_cfg(*GRPO, f"env.rl_jsonl={path}"), TOK)


def test_sft_row_longer_than_max_seq_len_names_the_key_to_raise(tmp_path: Path) -> None:
    rows = [{"prompt": "1+1=", "response": "2"}] * 4 + [{"prompt": "9" * 30, "response": "9" * 10}]
    path = _jsonl(tmp_path, rows)
    with pytest.raises(DatasetError) as info:
        validate_datasets(_cfg(*SFT, f"env.sft_jsonl={path}"), TOK)
    assert str(info.value) == (
        f"env.sft_jsonl: {path}:5: example has 42 tokens: 42 > policy.model.max_seq_len=32; raise "
        "policy.model.max_seq_len to at least 42, or shorten or drop the 1 row(s) this long"
    )
    report = validate_datasets(_cfg(*SFT, f"env.sft_jsonl={path}", "policy.model.max_seq_len=42"), TOK)
    assert report.checks[0].longest == 42


def test_rl_prompt_plus_new_tokens_over_the_limit(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"prompt": "1+1=", "answer": "2"}] * 3 + [{"prompt": "1" * 26, "answer": "1"}] * 2)
    with pytest.raises(DatasetError) as info:
        validate_datasets(_cfg(*GRPO, f"env.rl_jsonl={path}"), TOK)
    assert str(info.value) == (
        f"env.rl_jsonl: {path}:4: prompt has 27 tokens with policy.generation.max_new_tokens=6: 33 > "
        "policy.model.max_seq_len=32; raise policy.model.max_seq_len to at least 33 or lower "
        "policy.generation.max_new_tokens, or shorten or drop the 2 row(s) this long"
    )


def test_val_file_prompt_over_the_limit(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1" * 30, "answer": "1"}])
    with pytest.raises(DatasetError, match=rf"^env.val_jsonl: {path}:2: prompt has 31 tokens"):
        validate_datasets(_cfg(*SFT, f"env.val_jsonl={path}"), TOK)
    # Only the rows validation uses are length-checked (algorithm.val_samples=1).
    validate_datasets(_cfg(*SFT, f"env.val_jsonl={path}", "algorithm.val_samples=1"), TOK)


def test_sft_dataset_smaller_than_the_batch_names_the_batch_key(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"prompt": "1+1=", "response": "2"}] * 3)
    with pytest.raises(DatasetError) as info:
        validate_datasets(_cfg(*SFT, f"env.sft_jsonl={path}"), TOK)
    assert str(info.value) == (
        f"env.sft_jsonl: {path}: the file holds 3 rows, fewer than policy.train_global_batch_size=4 "
        "(one batch); add rows or lower policy.train_global_batch_size"
    )
    with pytest.raises(DatasetError, match=r"^algorithm.num_train_samples: the generator yields 3 rows, fewer than "
                       r"policy.train_global_batch_size=4"):
        validate_datasets(_cfg(*SFT, "algorithm.num_train_samples=3"), TOK)


def test_rl_dataset_smaller_than_the_batch_names_the_batch_key(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"prompt": "1+1=", "answer": "2"}] * 3)
    with pytest.raises(DatasetError, match=rf"^env.rl_jsonl: {path}: the file holds 3 rows, fewer than "
                       r"algorithm.num_prompts_per_step=4 \(one batch\); add rows or lower algorithm.num_prompts_per_step"):
        validate_datasets(_cfg(*GRPO, f"env.rl_jsonl={path}"), TOK)


def test_generator_too_small_names_its_size_key() -> None:
    with pytest.raises(DatasetError, match=r"^algorithm.val_samples: ArithmeticTask: asked for 5000 eval problems"):
        validate_datasets(_cfg(*SFT, "algorithm.val_samples=5000"), TOK)


def test_malformed_line_fails_before_anything_else(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"prompt": "1+1=", "answer": "2"}] * 4 + [{"prompt": "1+1="}])
    with pytest.raises(DatasetError, match=rf"^env.rl_jsonl: {path}:5: field 'answer' is missing"):
        validate_datasets(_cfg(*GRPO, f"env.rl_jsonl={path}"), TOK)


def test_sample_files_validate_and_match_the_trainer_datasets() -> None:
    cfg = _cfg(
        *GRPO,
        "algorithm.warm_start.enabled=true",
        f"env.sft_jsonl={DATA}/sft_chat.jsonl",
        f"env.rl_jsonl={DATA}/rl_messages.jsonl",
        f"env.val_jsonl={DATA}/rl_prompt.jsonl",
        "policy.model.max_seq_len=96",
        "policy.train_global_batch_size=16",
    )
    report = validate_datasets(cfg, TOK)
    assert [(c.key, c.rows) for c in report.checks] == [
        ("env.sft_jsonl", 16),
        ("env.val_jsonl", 16),
        ("env.rl_jsonl", 16),
        ("env.val_jsonl", 16),
    ]
    assert all(c.longest <= 96 for c in report.checks)
    assert "from " + f"{DATA}/sft_chat.jsonl" in report.lines()[0]
    ds = _train_dataset(cfg, TOK)
    assert len(ds) == 16 and ds[0].prompt == "Put the final answer in \\boxed{}.Compute 60+34."
    assert build_val_problems(cfg, TOK)[1].answer == "84 plus 67 is 151.\n#### 151"


def test_chat_template_lengths_are_what_the_template_renders() -> None:
    hf = build_hf_tokenizer()
    cfg = _cfg(*GRPO, f"env.rl_jsonl={DATA}/rl_messages.jsonl", "policy.model.max_seq_len=512")
    report = validate_datasets(cfg, hf)
    rendered = _train_dataset(cfg, hf)
    assert rendered[0].prompt.startswith("<|bos|><|im_start|>system\n") and rendered[0].prompt.endswith("assistant\n")
    # The template already starts with bos, so none is added on top; + max_new_tokens.
    assert all(hf.encode_prompt(p.prompt).count(hf.bos_id) == 1 for p in rendered.problems)
    longest = max(len(hf.encode(p.prompt)) for p in rendered.problems) + 6
    assert report.checks[0].longest == longest
    # An explicit limit (e.g. the HF model's max positions) and the key that sets it.
    with pytest.raises(DatasetError, match=rf"> policy.max_seq_len=8; raise policy.max_seq_len to at least {longest}"):
        validate_datasets(cfg, hf, max_seq_len=8, max_seq_len_key="policy.max_seq_len")


def test_template_that_cannot_split_turns_names_the_line(tmp_path: Path) -> None:
    hf = build_hf_tokenizer("{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m['content'] }}{% endfor %}")
    path = _jsonl(tmp_path, [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}] * 4)
    with pytest.raises(DatasetError, match=rf"^env.sft_jsonl: {path}:1: cannot be tokenized: the chat template"):
        validate_datasets(_cfg(*SFT, f"env.sft_jsonl={path}", "policy.model.max_seq_len=64"), hf)


def test_chat_format_of_the_built_in_task() -> None:
    from nemo_dp.config.env import EnvConfig
    from nemo_dp.data.chat import ChatExample
    from nemo_dp.data.datasets import collate_sft

    plain_sft, plain_rl = _cfg(*SFT), _cfg(*GRPO)
    chat_sft, chat_rl = _cfg(*SFT), _cfg(*GRPO)
    chat_sft.env = EnvConfig(format="chat")
    chat_rl.env = EnvConfig(format="chat")
    chat_ds = _train_dataset(chat_sft, TOK)
    assert all(isinstance(x, ChatExample) for x in chat_ds.pairs)
    # Without a chat template, chat form is the plain task bit for bit.
    a = collate_sft(_train_dataset(plain_sft, TOK).pairs[:64], TOK)
    b = collate_sft(chat_ds.pairs[:64], TOK)
    assert all(a[k].tolist() == b[k].tolist() for k in ("input_ids", "token_mask", "input_lengths"))
    assert _train_dataset(chat_rl, TOK).problems == _train_dataset(plain_rl, TOK).problems
    assert build_val_problems(chat_rl, TOK) == build_val_problems(plain_rl, TOK)
    # With one, prompts are the template's rendering of a one-turn conversation.
    hf = build_hf_tokenizer()
    first = _train_dataset(chat_rl, hf)[0]
    plain_first = _train_dataset(plain_rl, hf)[0]
    assert first.answer == plain_first.answer
    assert first.prompt == f"<|bos|><|im_start|>user\n{plain_first.prompt}<|im_end|>\n<|im_start|>assistant\n"
    chat_rl.policy.model.max_seq_len = 64
    assert validate_datasets(chat_rl, hf).checks[0].longest > validate_datasets(plain_rl, hf).checks[0].longest


def test_env_schema_names_the_key() -> None:
    from nemo_dp.config.env import EnvConfig

    with pytest.raises(ValueError, match=r"env.reward: got 'fuzzy'; legal values: \['auto', 'exact', 'math'\]"):
        EnvConfig(reward="fuzzy")
    with pytest.raises(ValueError, match=r"env.format: got 'xml'; legal values: \['plain', 'chat'\]"):
        EnvConfig(format="xml")
    with pytest.raises(ValueError, match="env.sft_jsonl: must be a file path or null"):
        EnvConfig(sft_jsonl=" ")
    with pytest.raises(ValueError, match="env.digits: must be >= 1"):
        EnvConfig(digits=0)


class _TypedErrorCharTokenizer(CharTokenizer):
    """The char tokenizer raising the typed ``UnknownCharacterError`` (isolates that path)."""

    def encode(self, text: str) -> list[int]:
        from nemo_dp.data.errors import UnknownCharacterError

        for pos, ch in enumerate(text):
            if ch not in self._char_to_id:
                raise UnknownCharacterError(ch, pos, text)
        return super().encode(text)


def test_typed_unknown_character_error_is_mapped_to_the_line(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [{"prompt": "1+1=", "response": "2"}] * 4 + [{"prompt": "1+1=", "response": "zwei é"}])
    with pytest.raises(DatasetError, match=rf"^env.sft_jsonl: {path}:5: field 'response' holds character 'é'"):
        validate_datasets(_cfg(*SFT, f"env.sft_jsonl={path}"), _TypedErrorCharTokenizer())


@pytest.mark.parametrize("algorithm", ["sft", "grpo", "ppo"])
def test_built_in_datasets_are_the_generator_rows_bit_for_bit(algorithm: str) -> None:
    from nemo_dp.data.arithmetic import ArithmeticTask

    cfg = _cfg("~recipe", f"algorithm={algorithm}", "data_plane=disabled", "env.digits=2", "env.seed=3")
    task = ArithmeticTask(2, ("+",), 3)
    ds = _train_dataset(cfg, TOK)
    if algorithm == "sft":
        assert ds.pairs == [(p.prompt, p.answer) for p in task.train_problems(cfg.algorithm.num_train_samples)]
    else:
        assert ds.problems == task.train_problems(cfg.algorithm.num_train_prompts)
    assert build_val_problems(cfg, TOK) == task.eval_problems(cfg.algorithm.val_samples)


def test_the_check_loads_no_ray_transformers_or_transfer_queue() -> None:
    import subprocess
    import sys

    code = (
        "import sys, nemo_dp.data.validation, nemo_dp.data.sources, nemo_dp.environments\n"
        "bad = [m for m in ('ray', 'transfer_queue', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    # The check sees a violation.
    seen = subprocess.run([sys.executable, "-c", "import transformers\n" + code], capture_output=True)
    assert seen.returncode != 0 and b"transformers" in seen.stderr
