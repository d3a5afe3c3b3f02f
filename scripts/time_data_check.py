"""Time the check before Ray starts on a large parquet file, and how much of it is tokenizing.

``python scripts/time_data_check.py [ROWS ...]`` writes an RL parquet file of ROWS 3-digit
additions (renamed columns) per size, then times ``validate_datasets`` three ways: on a cold
``datasets`` cache (the library converts the file to its Arrow cache once), on a warm one (a
later launch), and again in the same process (the run's trainers reuse the check's parse).
The tokenizing share is timed on its own over the same prompts.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_REPO))


def main(sizes: list[int]) -> None:
    import datasets
    from hydra import compose, initialize_config_dir

    from nemo_dp.config import CONF_DIR, register_configs, validate_config
    from nemo_dp.data import tables
    from nemo_dp.data.chat import encode_prompt_text
    from nemo_dp.data.validation import validate_datasets
    from nemo_dp.models.tiny.tokenizer import CharTokenizer

    datasets.disable_progress_bars()
    register_configs()
    tok = CharTokenizer()
    rng = random.Random(0)
    root = Path(tempfile.mkdtemp(prefix="time_data_check_"))
    for n in sizes:
        a = [rng.randrange(1000) for _ in range(n)]
        b = [rng.randrange(1000) for _ in range(n)]
        path = root / f"rl_{n}.parquet"
        prompts = [f"{x}+{y}=" for x, y in zip(a, b)]
        datasets.Dataset.from_dict({"question": prompts, "solution": [str(x + y) for x, y in zip(a, b)]}).to_parquet(str(path))
        with initialize_config_dir(str(CONF_DIR), version_base=None):
            cfg = validate_config(compose("config", overrides=[
                "~recipe", "algorithm=grpo", f"env.rl_data={path}", "env.columns.prompt=question",
                "env.columns.answer=solution",
            ]))
        datasets.config.HF_DATASETS_CACHE = root / f"cache_{n}"  # cold: nothing converted yet
        tables._CACHE.clear()
        t0 = time.perf_counter()
        validate_datasets(cfg, tok)
        cold = time.perf_counter() - t0
        tables._CACHE.clear()  # a later launch: the library's Arrow cache is warm
        t0 = time.perf_counter()
        validate_datasets(cfg, tok)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        validate_datasets(cfg, tok)
        again = time.perf_counter() - t0
        t0 = time.perf_counter()
        for p in prompts:
            encode_prompt_text(p, tok)
        tokenize = time.perf_counter() - t0
        print(
            f"{n} rows: cold cache {cold:.2f} s, warm cache {warm:.2f} s (tokenizing alone {tokenize:.2f} s), "
            f"same process again {again:.3f} s"
        )


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [10_000, 100_000])
