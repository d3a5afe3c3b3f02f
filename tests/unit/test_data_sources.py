"""Users' datasets through the ``datasets`` library: every source kind (jsonl, json, parquet, csv,
a glob, a ``save_to_disk`` directory, a ``DatasetDict`` split) gives the same problems, columns
are renamed by ``env.columns``, every fault is named before Ray starts, and the check before
Ray and the trainers' inputs share one parse and one tokenization."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest

from nemo_dp.algorithms.inputs import build_rl_inputs, build_sft_inputs
from nemo_dp.data import tables
from nemo_dp.data.errors import DatasetError
from nemo_dp.data.validation import validate_datasets
from nemo_dp.models.tiny.tokenizer import CharTokenizer
from tests.unit.test_data_validation import GRPO, SFT, _cfg

TOK = CharTokenizer()
ROWS = [{"question": f"{a}+{a}=", "solution": str(2 * a), "level": a % 3} for a in range(8)]


def build_train_dataset(cfg: object, tokenizer: object) -> object:
    """The training dataset the run builds: the algorithm's registered input builder's."""
    from nemo_dp.config.algorithm_registry import algorithm
    from nemo_dp.utils.imports import resolve_target

    builder = resolve_target(algorithm(str(cfg.algorithm.name)).input_builder)
    return builder(cfg, tokenizer).train_loader.dataset


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Isolates the library's Arrow cache (and this module's table cache) per test.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr(tables, "_CACHE", {})


def _mapped(path: str | Path, *extra: str) -> Any:
    return _cfg(*GRPO, f"env.rl_data={path}", "env.columns.prompt=question", "env.columns.answer=solution", *extra)


def _write(tmp_path: Path, kind: str, rows: list[dict[str, Any]] = ROWS) -> Path:
    ds = datasets.Dataset.from_list(rows) if kind in ("parquet", "csv", "saved") else None
    if kind == "jsonl":
        path = tmp_path / "d.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path = tmp_path / "d.json"
        path.write_text(json.dumps(rows))
    elif kind == "parquet":
        path = tmp_path / "d.parquet"
        ds.to_parquet(str(path))  # type: ignore[union-attr]
    elif kind == "csv":
        path = tmp_path / "d.csv"
        ds.to_csv(str(path), index=False)  # type: ignore[union-attr]
    elif kind == "glob":
        (tmp_path / "parts").mkdir()
        datasets.Dataset.from_list(rows[:5]).to_parquet(str(tmp_path / "parts" / "a.parquet"))
        datasets.Dataset.from_list(rows[5:]).to_parquet(str(tmp_path / "parts" / "b.parquet"))
        return tmp_path / "parts" / "*.parquet"
    elif kind == "saved":
        path = tmp_path / "saved"
        ds.save_to_disk(str(path))  # type: ignore[union-attr]
    else:
        raise AssertionError(kind)
    return path


@pytest.mark.parametrize("kind", ["jsonl", "json", "parquet", "csv", "glob", "saved"])
def test_every_source_kind_gives_the_same_problems(tmp_path: Path, kind: str) -> None:
    cfg = _mapped(_write(tmp_path, kind))
    report = validate_datasets(cfg, TOK)
    assert (report.checks[0].key, report.checks[0].rows) == ("env.rl_data", 8)
    problems = build_train_dataset(cfg, TOK).problems
    assert [(p.prompt, p.answer) for p in problems] == [(r["question"], r["solution"]) for r in ROWS]
    # The answer carries its row for reward functions: the prompt and every other column.
    # (csv columns are text: the file holds text, and no number is guessed from it)
    assert problems[3].answer.prompt == "3+3=" and str(problems[3].answer.columns["level"]) == "0"
    assert set(problems[3].answer.columns) == {"solution", "level"}


def test_rows_are_read_lazily_from_the_memory_mapped_table(tmp_path: Path) -> None:
    cfg = _mapped(_write(tmp_path, "parquet"))
    problems = build_train_dataset(cfg, TOK).problems
    assert not isinstance(problems, list) and len(problems) == 8
    assert problems[-1].prompt == "7+7=" and [p.prompt for p in problems[1:3]] == ["1+1=", "2+2="]
    table = tables.open_table(str(tmp_path / "d.parquet"), key="env.rl_data")
    assert table.dataset.cache_files, "a file-backed (memory-mapped) Arrow table"


def test_dataset_dict_split(tmp_path: Path) -> None:
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:4])})
    dd.save_to_disk(str(tmp_path / "dd"))
    cfg = _mapped(tmp_path / "dd", "env.split=train")
    assert validate_datasets(cfg, TOK).checks[0].rows == 8
    with pytest.raises(DatasetError, match=r"^env.rl_data: .*dd: holds a DatasetDict with splits \['train', 'test'\]; "
                       r"choose one; set env.split"):
        validate_datasets(_mapped(tmp_path / "dd"), TOK)
    with pytest.raises(DatasetError, match=r"^env.split: .*dd: has no split 'dev'; splits: \['train', 'test'\]"):
        validate_datasets(_mapped(tmp_path / "dd", "env.split=dev"), TOK)


def test_chat_rows_in_parquet_and_sft_columns(tmp_path: Path) -> None:
    chat = [{"conv": [{"role": "user", "content": f"{a}+1="}], "gold": str(a + 1)} for a in range(4)]
    datasets.Dataset.from_list(chat).to_parquet(str(tmp_path / "c.parquet"))
    cfg = _cfg(*GRPO, f"env.rl_data={tmp_path}/c.parquet", "env.columns.messages=conv", "env.columns.answer=gold")
    problems = build_train_dataset(cfg, TOK).problems
    assert problems[2].prompt == "2+1=" and problems[2].answer == "3"
    assert problems[2].answer.chat and problems[2].answer.prompt == [{"role": "user", "content": "2+1="}]
    sft = [{"q": f"{a}+1=", "a": str(a + 1)} for a in range(4)]
    datasets.Dataset.from_list(sft).to_parquet(str(tmp_path / "s.parquet"))
    scfg = _cfg(*SFT, f"env.sft_data={tmp_path}/s.parquet", "env.columns.prompt=q", "env.columns.response=a")
    assert list(build_train_dataset(scfg, TOK).pairs) == [(r["q"], r["a"]) for r in sft]


def test_old_and_new_key_names(tmp_path: Path) -> None:
    path = _write(tmp_path, "jsonl", [{"prompt": "1+1=", "answer": "2"}] * 4)
    assert validate_datasets(_cfg(*GRPO, f"env.rl_jsonl={path}"), TOK).checks[0].key == "env.rl_jsonl"
    assert validate_datasets(_cfg(*GRPO, f"env.rl_data={path}"), TOK).checks[0].key == "env.rl_data"
    with pytest.raises(ValueError, match="env.rl_data and env.rl_jsonl are both set"):
        _cfg(*GRPO, f"env.rl_data={path}", f"env.rl_jsonl={path}")


def test_missing_file_and_missing_column_name_key_file_and_columns(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=rf"^env.rl_data: {tmp_path}/nope.parquet: file does not exist"):
        validate_datasets(_mapped(tmp_path / "nope.parquet"), TOK)
    with pytest.raises(DatasetError, match=r"the pattern matches no file"):
        validate_datasets(_mapped(tmp_path / "*.parquet"), TOK)
    path = _write(tmp_path, "parquet")
    with pytest.raises(DatasetError) as info:
        validate_datasets(_cfg(*GRPO, f"env.rl_data={path}", "env.columns.prompt=question"), TOK)
    assert str(info.value) == (
        f"env.rl_data: {path}: has no column 'answer' (columns: ['question', 'solution', 'level']); "
        "set env.columns.answer to the column that holds it"
    )
    with pytest.raises(DatasetError, match=r"has neither column 'prompt' nor 'messages' \(columns: \['question', "
                       r"'solution', 'level'\]\); set env.columns.prompt"):
        validate_datasets(_cfg(*GRPO, f"env.rl_data={path}"), TOK)
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DatasetError, match=r"has no readable format \(suffix .txt\)"):
        validate_datasets(_mapped(tmp_path / "d.txt"), TOK)
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(DatasetError, match=r"is a directory but not one written by Dataset.save_to_disk"):
        validate_datasets(_mapped(tmp_path / "emptydir"), TOK)


def test_wrong_type_in_a_row_names_the_row_and_column(tmp_path: Path) -> None:
    rows = [dict(r) for r in ROWS]
    rows[5]["question"] = None
    path = _write(tmp_path, "parquet", rows)
    with pytest.raises(DatasetError) as info:
        validate_datasets(_mapped(path), TOK)
    assert str(info.value) == f"env.rl_data: {path}: row 5: needs field 'messages' or 'question'"
    assert info.value.row == 5
    rows[5]["question"] = 17
    with pytest.raises(DatasetError) as info:
        validate_datasets(_mapped(_write(tmp_path, "json", rows)), TOK)
    assert str(info.value) == f"env.rl_data: {tmp_path}/d.json: row 5: field 'question' must be a string, got int"
    assert (info.value.row, info.value.field) == (5, "question")
    floats = [{"question": "1+1=", "solution": 2.5}] * 4
    with pytest.raises(DatasetError, match=r"row 0: field 'solution' must be a string or an integer, got float"):
        validate_datasets(_mapped(_write(tmp_path, "json", floats)), TOK)


def test_jsonl_faults_keep_their_file_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "1+2=", "answer": 3}\n{"prompt": 5, "answer": "1"}\n')
    with pytest.raises(DatasetError, match=rf"^env.rl_data: {path}:4: field 'prompt' must be a string, got int"):
        validate_datasets(_cfg(*GRPO, f"env.rl_data={path}"), TOK)
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": \n')
    with pytest.raises(DatasetError, match=rf"^env.rl_data: {path}:2: malformed JSON line"):
        validate_datasets(_cfg(*GRPO, f"env.rl_data={path}"), TOK)


def test_empty_dataset_and_fewer_rows_than_a_batch(tmp_path: Path) -> None:
    empty = datasets.Dataset.from_dict({"prompt": [], "answer": []})
    empty.to_parquet(str(tmp_path / "e.parquet"))
    with pytest.raises(DatasetError, match=rf"^env.rl_data: {tmp_path}/e.parquet: no records"):
        validate_datasets(_cfg(*GRPO, f"env.rl_data={tmp_path}/e.parquet"), TOK)
    path = _write(tmp_path, "parquet", ROWS[:3])
    with pytest.raises(DatasetError, match=r"the file holds 3 rows, fewer than algorithm.num_prompts_per_step=4"):
        validate_datasets(_mapped(path), TOK)


def test_row_longer_than_max_seq_len_names_its_row(tmp_path: Path) -> None:
    rows = [dict(r) for r in ROWS]
    rows[6]["question"] = "1" * 30
    with pytest.raises(DatasetError, match=r"row 6: prompt has 31 tokens with policy.generation.max_new_tokens=6: "
                       r"37 > policy.model.max_seq_len=32"):
        validate_datasets(_mapped(_write(tmp_path, "parquet", rows)), TOK)


def test_bom_empty_rows_and_a_short_validation_file(tmp_path: Path) -> None:
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "1+1=", "answer": "2"}\n' * 4)
    assert validate_datasets(_cfg(*GRPO, f"env.rl_jsonl={bom}"), TOK).checks[0].rows == 4
    empty = tmp_path / "empty_prompt.jsonl"
    empty.write_text('{"prompt": "1+1=", "response": "2"}\n' * 4 + '{"prompt": "1+1=", "response": " "}\n')
    with pytest.raises(DatasetError, match=rf"^env.sft_jsonl: {empty}:5: field 'response' is empty"):
        validate_datasets(_cfg(*SFT, f"env.sft_jsonl={empty}"), TOK)
    val = _write(tmp_path, "jsonl", [{"prompt": "1+1=", "answer": "2"}] * 3)
    report = validate_datasets(_cfg(*GRPO, f"env.val_data={val}", "algorithm.val_samples=16"), TOK)
    assert report.checks[-1].rows == 3
    assert report.lines()[-1].endswith(
        "NOTE: the file holds 3 rows, fewer than algorithm.val_samples=16: all 3 are used"
    )


def test_one_parse_and_one_tokenization_serve_the_check_and_the_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[Any] = []
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: loads.append(a) or real(*a, **k))
    encoded: list[str] = []

    class CountingTokenizer(CharTokenizer):
        def encode(self, text: str) -> list[int]:
            encoded.append(text)
            return super().encode(text)

    tok = CountingTokenizer()
    cfg = _mapped(_write(tmp_path, "parquet"), f"env.val_data={tmp_path}/d.parquet", "algorithm.val_samples=8")
    validate_datasets(cfg, tok)
    assert len(loads) == 1  # one file, one parse, although it is both the train and val set
    first = len(encoded)
    assert first == 8  # each prompt tokenized once (the val set's lengths come from the same memo)
    inputs = build_rl_inputs(cfg, tok)
    validate_datasets(cfg, tok)
    assert len(loads) == 1 and len(encoded) == first
    assert inputs.train_loader.dataset.problems[0].prompt == "0+0=" and len(inputs.val_problems) == 8
    # A changed file is parsed again.
    _write(tmp_path, "parquet", ROWS[::-1])
    assert build_train_dataset(cfg, tok).problems[0].prompt == "7+7=" and len(loads) == 2
    sft = _cfg(*SFT, f"env.sft_data={_write(tmp_path, 'jsonl', [{'prompt': '1+1=', 'response': '2'}] * 4)}")
    validate_datasets(sft, tok)
    assert list(build_sft_inputs(sft, tok).train_loader.dataset.pairs) == [("1+1=", "2")] * 4


def test_a_blank_text_in_a_typed_column_is_found_row_by_row(tmp_path: Path) -> None:
    # A string column without nulls passes by its type unless a value is blank; then the rows
    # are checked one by one and the blank one is named.
    rows = [dict(r) for r in ROWS]
    rows[4]["question"] = "  "
    with pytest.raises(DatasetError, match=r": row 4: field 'question' is empty$"):
        validate_datasets(_mapped(_write(tmp_path, "parquet", rows)), TOK)
    sft = [{"q": "1+1=", "a": "2"}] * 3 + [{"q": "1+1=", "a": ""}]
    datasets.Dataset.from_list(sft).to_parquet(str(tmp_path / "s.parquet"))
    cfg = _cfg(*SFT, f"env.sft_data={tmp_path}/s.parquet", "env.columns.prompt=q", "env.columns.response=a")
    with pytest.raises(DatasetError, match=r": row 3: field 'a' is empty$"):
        validate_datasets(cfg, TOK)
