"""The tokenizer and env a worker scores rollouts with: sent to it once, then named by a digest.

Unpickling a real model's tokenizer costs a worker about 0.1 s per call, so a driver sends the pair
only to workers that do not hold it yet; a change made in place gives a new digest, and the pair
is sent again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from typing import Any

__all__ = ["ScoringPairHolder", "ScoringPairSender", "pair_digest"]


def pair_digest(tokenizer: Any, env: Any) -> str:
    """A digest of the pair's serialized bytes (what Ray would send)."""
    from ray import cloudpickle

    return hashlib.blake2b(cloudpickle.dumps((tokenizer, env)), digest_size=16).hexdigest()


class ScoringPairSender:
    """Driver side: the digest each worker (any key) is known to hold."""

    def __init__(self) -> None:
        self._held: dict[Hashable, str] = {}

    def kwargs(self, worker: Hashable, digest: str, tokenizer: Any, env: Any) -> dict[str, Any]:
        """``generate_into_store``'s scoring arguments for ``worker``: the digest, and the pair unless it holds it."""
        if self._held.get(worker) == digest:
            return {"scoring_digest": digest}
        return {"scoring_digest": digest, "tokenizer": tokenizer, "env": env}

    def sent(self, worker: Hashable, digest: str) -> None:
        """Record that ``worker`` finished a call carrying ``digest`` (so it holds that pair)."""
        self._held[worker] = digest


class ScoringPairHolder:
    """Worker side: the last pair received, under its digest; ``owner`` names the worker in errors."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._held: tuple[str, Any, Any] | None = None

    def resolve(self, tokenizer: Any, env: Any, digest: str | None) -> tuple[Any, Any]:
        """The pair to score with: as given (kept when a digest comes with it) or the one kept under ``digest``.

        Raises:
            RuntimeError: ``digest`` comes alone and names no pair this worker holds.
        """
        if digest is None:
            return tokenizer, env
        if tokenizer is not None or env is not None:
            self._held = (digest, tokenizer, env)
            return tokenizer, env
        held = self._held
        if held is None or held[0] != digest:
            raise RuntimeError(
                f"{self.owner}.generate_into_store: scoring_digest {digest} names no tokenizer "
                f"and env this worker holds (it holds {held[0] if held else 'none'}); send them with the digest"
            )
        return held[1], held[2]
