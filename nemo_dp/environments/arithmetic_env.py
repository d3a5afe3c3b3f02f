"""Verifiable reward for the arithmetic task (and any exact-answer task)."""

from __future__ import annotations

import torch

#: How the character tokenizer renders eos when decoding with the specials; a response is cut
#: there. Kept here, not imported, so the reward does not depend on where that tokenizer
#: lives (a unit test pins the two together).
EOS_MARKER = "<eos>"


class ArithmeticEnv:
    """Exact-match reward: 1.0 when the response text before eos equals the answer."""

    def score(self, responses: list[str], answers: list[str]) -> torch.Tensor:
        """Float32 ``[N]`` rewards in {0.0, 1.0}; a literal ``"<eos>"`` in a response also ends it.

        Raises:
            ValueError: If the lists differ in length.
        """
        if len(responses) != len(answers):
            raise ValueError(f"ArithmeticEnv.score: {len(responses)} responses for {len(answers)} answers")
        rewards = [float(r.split(EOS_MARKER, 1)[0] == a) for r, a in zip(responses, answers)]
        return torch.tensor(rewards, dtype=torch.float32)
