"""Offline tiny HuggingFace checkpoints: ``python -m nemo_dp.models.hf.make_tiny --arch llama --out DIR``.
A byte-level BPE tokenizer trained on the arithmetic task plus a randomly initialised Llama, Qwen2 or GPT-2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nemo_dp.data.arithmetic import SUPPORTED_OPERATORS, ArithmeticTask

__all__ = [
    "ARCHS", "TINY_CACHE_DIR", "CHAT_TEMPLATE", "SPECIAL_TOKENS", "TinyDims", "make_tiny_checkpoint",
    "ensure_tiny_checkpoint", "main",
]

#: Architectures this command can write.
ARCHS: tuple[str, ...] = ("llama", "qwen2", "gpt2")
#: The default cache directory (relative to the working directory): ``policy.model_name_or_path``
#: = ``<TINY_CACHE_DIR>/tiny-<arch>`` is the one path the launcher builds on first use.
TINY_CACHE_DIR = ".cache/nemo_dp"

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|im_end|>"
START_TOKEN = "<|im_start|>"
# Some architectures' tokenizer classes (Qwen2, GPT-2) add this as their default unk token
# when it is missing, which would grow the vocabulary past the model's embedding rows.
UNK_TOKEN = "<|endoftext|>"
#: Special tokens, in id order (ids 0..4).
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, START_TOKEN, UNK_TOKEN)

#: ChatML-style template: an assistant turn ends with the eos token, so generation stops there.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_FILES_DONE = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _corpus(digits: int, n: int, seed: int) -> Iterator[str]:
    task = ArithmeticTask(digits=digits, operators=SUPPORTED_OPERATORS, seed=seed)
    for p in task.train_problems(n):
        yield f"{START_TOKEN}user\n{p.prompt}{EOS_TOKEN}\n{START_TOKEN}assistant\n{p.answer}{EOS_TOKEN}\n"
        yield f"{p.prompt}{p.answer}"


def train_bpe_tokenizer(
    corpus: Iterable[str], vocab_size: int, *, extra_specials: Sequence[str] = (), chat_template: str = CHAT_TEMPLATE
) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``corpus``; ``extra_specials`` follow the defaults."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    # One token per digit (as Qwen2 and Llama 3 tokenizers do): multi-digit merges would make
    # every number its own symbol and arithmetic needlessly hard for a tiny model.
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[*SPECIAL_TOKENS, *extra_specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token=PAD_TOKEN, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, unk_token=UNK_TOKEN,
        additional_special_tokens=[START_TOKEN, *extra_specials],
    )
    tok.chat_template = chat_template
    return tok


def special_token_ids(tok: Any) -> dict[str, int]:
    """``pad_token_id``, ``bos_token_id`` and ``eos_token_id`` of ``tok`` (model config keys)."""
    return {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


def seeded_model(seed: int, build: Callable[[], Any], ids: dict[str, int]) -> Any:
    """``build()`` under a forked torch RNG seeded by ``seed``, its generation config given ``ids``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    return model


@dataclass(frozen=True)
class TinyDims:
    """Shape of a tiny checkpoint (defaults: the ``policy=hf`` default model's; GPT-2 ignores the MLP and KV sizes)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2

    def __post_init__(self) -> None:
        check_at_least_one("make_tiny", self)
        check_divides("make_tiny", self, ("num_heads", "hidden_size"), ("num_kv_heads", "num_heads"))


def check_at_least_one(where: str, dims: Any) -> None:
    """Raise ``ValueError`` (prefixed ``where``) unless every field of the dataclass ``dims`` is >= 1."""
    for f in dataclasses.fields(dims):
        if getattr(dims, f.name) < 1:
            raise ValueError(f"{where}: {f.name} must be >= 1, got {getattr(dims, f.name)}")


def check_divides(where: str, dims: Any, *pairs: tuple[str, str]) -> None:
    """Raise ``ValueError`` (prefixed ``where``) unless, for each ``(a, b)``, field ``a`` divides field ``b``."""
    for a, b in pairs:
        if getattr(dims, b) % getattr(dims, a):
            raise ValueError(f"{where}: {a} ({getattr(dims, a)}) must divide {b} ({getattr(dims, b)})")


def _model_config(arch: str, vocab: int, ids: dict[str, int], max_positions: int, dims: TinyDims) -> object:
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    common = {"vocab_size": vocab, **ids}
    if arch in ("llama", "qwen2"):
        cls = LlamaConfig if arch == "llama" else Qwen2Config
        return cls(
            hidden_size=dims.hidden_size, intermediate_size=dims.intermediate_size,
            num_hidden_layers=dims.num_layers, num_attention_heads=dims.num_heads,
            num_key_value_heads=dims.num_kv_heads, max_position_embeddings=max_positions,
            tie_word_embeddings=False, **common,
        )
    return GPT2Config(
        n_embd=dims.hidden_size, n_layer=dims.num_layers, n_head=dims.num_heads, n_positions=max_positions,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common,
    )


def make_tiny_checkpoint(
    arch: str, out: str | os.PathLike[str], *, seed: int = 0, digits: int = 3, vocab_size: int = 384,
    max_positions: int = 128, dims: TinyDims | None = None,
) -> Path:
    """Write a tokenizer and a random ``arch`` model (``seed`` for both) into ``out``; return it.

    Raises ``ValueError`` for an unknown architecture.
    """
    from transformers import AutoModelForCausalLM

    if arch not in ARCHS:
        raise ValueError(f"make_tiny: --arch got {arch!r}; legal values: {list(ARCHS)}")
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    tok = train_bpe_tokenizer(_corpus(digits, 2000, seed), vocab_size)
    ids = special_token_ids(tok)
    config = _model_config(arch, len(tok), ids, max_positions, dims or TinyDims())
    model = seeded_model(seed, lambda: AutoModelForCausalLM.from_config(config, dtype=torch.float32), ids)
    model.save_pretrained(str(target))
    tok.save_pretrained(str(target))
    return target


def ensure_tiny_checkpoint(
    arch: str, cache_dir: str | os.PathLike[str], *, seed: int = 0, dims: TinyDims | None = None,
    name: str | None = None,
) -> Path:
    """The tiny ``arch`` checkpoint ``cache_dir/<name>`` (default ``tiny-<arch>``; give other ``dims`` their own)."""
    return build_once(
        Path(cache_dir) / (name or f"tiny-{arch}"), _FILES_DONE,
        lambda tmp: make_tiny_checkpoint(arch, tmp, seed=seed, dims=dims),
    )


def build_once(final: Path, done_files: Sequence[str], build: Callable[[Path], Any]) -> Path:
    """``final``, built in a private sibling and renamed into place unless it holds all ``done_files`` (race-safe)."""
    if all((final / f).is_file() for f in done_files):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{final.name}.tmp-{uuid.uuid4().hex}"
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not all((final / f).is_file() for f in done_files):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point (``argv`` default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=ARCHS, required=True)
    parser.add_argument("--out", required=True, help="target directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=128)
    fields = dataclasses.fields(TinyDims)
    for f in fields:
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=int, default=f.default)
    args = parser.parse_args(argv)
    dims = TinyDims(**{f.name: getattr(args, f.name) for f in fields})
    path = make_tiny_checkpoint(args.arch, args.out, seed=args.seed, max_positions=args.max_positions, dims=dims)
    print(f"wrote tiny {args.arch} checkpoint to {path}: {sorted(p.name for p in path.iterdir())}")


if __name__ == "__main__":
    main()
