"""Import location kept for callers outside ``nemo_dp.models``: the tiny model now lives in
``nemo_dp.models.tiny.model``; new code builds models with ``nemo_dp.models.builders``.
"""

from __future__ import annotations

from nemo_dp.models.tiny.model import KVCache, ModelConfig, TinyCausalLM

__all__ = ["KVCache", "ModelConfig", "TinyCausalLM"]
