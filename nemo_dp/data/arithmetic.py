"""Built-in arithmetic task: seeded verifiable problems such as ``"37+5="`` -> ``"42"``; a stable hash of
``(a, op, b)`` keeps the eval set disjoint from every train set."""

from __future__ import annotations

import hashlib
import operator
import random
from dataclasses import dataclass

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
SUPPORTED_OPERATORS: tuple[str, ...] = tuple(_OPS)

# One bucket in EVAL_BUCKETS of the problem space is held out for evaluation.
EVAL_BUCKETS: int = 10

# Above this many problems the space is sampled by rejection instead of enumerated.
_ENUMERATION_LIMIT: int = 400_000


@dataclass(frozen=True)
class Problem:
    """One prompt (e.g. ``"37+5="``) with its exact expected answer (e.g. ``"42"``)."""

    prompt: str
    answer: str


def is_eval_problem(a: int, op: str, b: int) -> bool:
    """Whether ``(a, op, b)`` belongs to the held-out partition (about 1 in ``EVAL_BUCKETS`` problems)."""
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % EVAL_BUCKETS == 0


def make_problem(a: int, op: str, b: int) -> Problem:
    """The problem ``f"{a}{op}{b}="`` with its answer (``ValueError`` for another operator or a negative operand)."""
    if op not in SUPPORTED_OPERATORS:
        raise ValueError(f"make_problem: operator {op!r} not in {SUPPORTED_OPERATORS}")
    if a < 0 or b < 0:
        raise ValueError(f"make_problem: operands must be non-negative, got a={a}, b={b}")
    return Problem(prompt=f"{a}{op}{b}=", answer=str(_OPS[op](a, b)))


class ArithmeticTask:
    """Deterministic generator of distinct problems, operands uniform in ``[0, 10**digits)``, the operator uniform
    in ``operators`` (a non-empty subset of ``SUPPORTED_OPERATORS`` without duplicates; ``ValueError`` if not)."""

    def __init__(self, digits: int, operators: tuple[str, ...], seed: int) -> None:
        if digits < 1:
            raise ValueError(f"ArithmeticTask: digits must be >= 1, got {digits}")
        ops = tuple(operators)
        if not ops:
            raise ValueError("ArithmeticTask: operators must not be empty")
        for op in ops:
            if op not in SUPPORTED_OPERATORS:
                raise ValueError(f"ArithmeticTask: operator {op!r} not in {SUPPORTED_OPERATORS}")
        if len(set(ops)) != len(ops):
            raise ValueError(f"ArithmeticTask: duplicate operator in {ops}")
        self.digits, self.operators, self.seed = digits, ops, seed
        self._limit = 10**digits
        self._enumerated: dict[bool, list[tuple[int, str, int]]] | None = None

    @property
    def space_size(self) -> int:
        """Number of problems in both partitions."""
        return self._limit * self._limit * len(self.operators)

    def _partition(self, eval_part: bool) -> list[tuple[int, str, int]]:
        if self._enumerated is None:
            parts: dict[bool, list[tuple[int, str, int]]] = {True: [], False: []}
            for op in self.operators:
                for a in range(self._limit):
                    for b in range(self._limit):
                        parts[is_eval_problem(a, op, b)].append((a, op, b))
            self._enumerated = parts
        return self._enumerated[eval_part]

    def _draw(self, n: int, eval_part: bool) -> list[Problem]:
        if n < 0:
            raise ValueError(f"ArithmeticTask: number of problems must be >= 0, got {n}")
        name = "eval" if eval_part else "train"
        # A str seed is hashed with SHA-512 by `random`, independent of PYTHONHASHSEED.
        rng = random.Random(f"arith-{name}-{self.seed}")
        if self.space_size <= _ENUMERATION_LIMIT:
            pool = self._partition(eval_part)
            if n > len(pool):
                raise ValueError(
                    f"ArithmeticTask: asked for {n} {name} problems but the {name} partition of "
                    f"digits={self.digits}, operators={self.operators} holds only {len(pool)}"
                )
            return [make_problem(*t) for t in rng.sample(pool, n)]
        if n > self.space_size // (2 * EVAL_BUCKETS):
            raise ValueError(
                f"ArithmeticTask: asked for {n} {name} problems, too many to sample without "
                f"duplicates from a space of {self.space_size}"
            )
        seen: set[tuple[int, str, int]] = set()
        out: list[Problem] = []
        while len(out) < n:
            t = (rng.randrange(self._limit), rng.choice(self.operators), rng.randrange(self._limit))
            if t in seen or is_eval_problem(*t) != eval_part:
                continue
            seen.add(t)
            out.append(make_problem(*t))
        return out

    def train_problems(self, n: int) -> list[Problem]:
        """``n`` distinct training problems in a seed-determined order (``ValueError`` if there are not enough)."""
        return self._draw(n, eval_part=False)

    def eval_problems(self, n: int) -> list[Problem]:
        """:meth:`train_problems` from the held-out partition (disjoint from any train set)."""
        return self._draw(n, eval_part=True)
