"""Import location kept for callers outside ``nemo_dp.models``: the char tokenizer now lives in
``nemo_dp.models.tiny.tokenizer`` (with the tiny model it belongs to).

New code builds its tokenizer with ``nemo_dp.models.builders.build_tokenizer(policy_cfg)``.
"""

from __future__ import annotations

from nemo_dp.models.tiny.tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, CharTokenizer

__all__ = ["BOS_TOKEN", "EOS_TOKEN", "PAD_TOKEN", "CharTokenizer"]
