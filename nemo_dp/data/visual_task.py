"""Built-in visual task: small images rendered with Pillow, a question, an exact answer.

Kinds: ``"digit"`` (which seven-segment digit is shown), ``"count"`` (how many squares, 1 to
``max_count``), ``"colour"`` (the digit's colour, one of :data:`COLOUR_NAMES`).  Images vary in
size.  A problem is a rendering spec drawn from a seeded generator; a stable hash of the spec
splits train and held-out partitions, so the held-out set is disjoint from every train set.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

__all__ = [
    "IMAGE_SIZES", "COLOUR_NAMES", "KINDS", "VisualProblem", "VisualPrompt", "VisualSFTExample", "VisualTask",
    "exact_match_reward", "render",
]

KINDS: tuple[str, ...] = ("digit", "count", "colour")
#: Image widths and heights (multiples of 8, the tiny VLM's patch * merge size).
IMAGE_SIZES: tuple[int, ...] = (16, 24, 32)
EVAL_BUCKETS = 10
QUESTIONS = {
    "digit": "Which digit is shown?", "count": "How many squares are there?", "colour": "What colour is the digit?",
}

# Segments a..g of a seven-segment digit, as (x0, y0, x1, y1) on a 2 x 4 grid of cells.
_SEGMENTS = {
    "a": (0, 0, 2, 0), "b": (2, 0, 2, 2), "c": (2, 2, 2, 4), "d": (0, 4, 2, 4),
    "e": (0, 2, 0, 4), "f": (0, 0, 0, 2), "g": (0, 2, 2, 2),
}
_DIGITS = {
    0: "abcdef", 1: "bc", 2: "abdeg", 3: "abcdg", 4: "bcfg",
    5: "acdfg", 6: "acdefg", 7: "abc", 8: "abcdefg", 9: "abcdfg",
}
_PALETTE = ((0, 0, 0), (255, 255, 255), (220, 40, 40), (40, 160, 60), (40, 70, 220), (240, 200, 30))
#: The answers of a ``"colour"`` problem, one per palette entry.
COLOUR_NAMES: tuple[str, ...] = ("black", "white", "red", "green", "blue", "yellow")


@dataclass(frozen=True)
class VisualPrompt:
    """A visual question as the trainers pass it around: the rendering spec, not the pixels.

    The policy's workers render and encode it (image processor, placeholder expansion), so a
    trainer moves a few integers per prompt and the image tensors exist only in the workers.
    ``spec`` holds the rendering parameters (see :func:`render`).
    """

    kind: str
    spec: tuple[int, ...]
    question: str

    def image(self) -> Any:
        """The rendered ``PIL.Image.Image`` (RGB)."""
        return render(self.kind, self.spec)

    def messages(self) -> list[dict[str, Any]]:
        """The prompt as chat turns with an image part (``{"type": "image", "image": PIL}``)."""
        return [
            {"role": "user", "content": [{"type": "image", "image": self.image()}, {"type": "text", "text": self.question}]}
        ]

    def __str__(self) -> str:
        return f"[{self.kind} image {self.spec[1]}x{self.spec[2]}] {self.question} "


@dataclass(frozen=True)
class VisualProblem:
    """One image question (fields as :class:`VisualPrompt`) with its exact expected ``answer``."""

    kind: str
    spec: tuple[int, ...]
    question: str
    answer: str

    @property
    def prompt(self) -> VisualPrompt:
        """The question without its answer (what rollouts send to the policy)."""
        return VisualPrompt(self.kind, self.spec, self.question)

    def image(self) -> Any:
        """Like :meth:`VisualPrompt.image`."""
        return render(self.kind, self.spec)

    def messages(self) -> list[dict[str, Any]]:
        """Like :meth:`VisualPrompt.messages`."""
        return self.prompt.messages()


@dataclass(frozen=True)
class VisualSFTExample:
    """A supervised example of the visual task: the prompt and the response to learn (the exact answer)."""

    prompt: VisualPrompt
    response: str


def _draw_digit(draw: Any, spec: tuple[int, ...]) -> None:
    digit, width, height, fg, bg, x0, y0, cell, thick = spec
    del width, height, bg
    colour = _PALETTE[fg]
    for seg in _DIGITS[digit]:
        ax, ay, bx, by = _SEGMENTS[seg]
        left, top = x0 + ax * cell, y0 + ay * cell
        right, bottom = x0 + bx * cell + thick - 1, y0 + by * cell + thick - 1
        draw.rectangle((left, top, right, bottom), fill=colour)


def _draw_squares(draw: Any, spec: tuple[int, ...]) -> None:
    count, width, height, fg, bg, side = spec[:6]
    del count, width, height, bg
    corners = spec[6:]
    for i in range(0, len(corners), 2):
        x, y = corners[i], corners[i + 1]
        draw.rectangle((x, y, x + side - 1, y + side - 1), fill=_PALETTE[fg])


def render(kind: str, spec: tuple[int, ...]) -> Any:
    """Render a problem's image: an RGB ``PIL.Image.Image`` of size ``(width, height)``.

    ``spec`` is ``(digit, width, height, fg, bg, x0, y0, cell, thickness)`` for ``"digit"`` and
    ``"colour"``, ``(count, width, height, fg, bg, side, x1, y1, x2, y2, ...)`` for ``"count"``.

    Raises:
        ValueError: Unknown kind.
    """
    from PIL import Image, ImageDraw

    if kind not in KINDS:
        raise ValueError(f"render: kind {kind!r} not in {KINDS}")
    image = Image.new("RGB", (spec[1], spec[2]), _PALETTE[spec[4]])
    draw = ImageDraw.Draw(image)
    (_draw_squares if kind == "count" else _draw_digit)(draw, spec)
    return image


def _is_eval(kind: str, spec: tuple[int, ...]) -> bool:
    digest = hashlib.sha256(f"{kind}:{spec}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % EVAL_BUCKETS == 0


def _colours(rng: random.Random) -> tuple[int, int]:
    fg, bg = rng.sample(range(len(_PALETTE)), 2)
    return fg, bg


def _digit_spec(rng: random.Random) -> tuple[int, ...]:
    width, height = rng.choice(IMAGE_SIZES), rng.choice(IMAGE_SIZES)
    thick = rng.randint(2, 3)
    # the digit is 2 cells wide and 4 tall, plus one stroke
    cell = rng.randint(2, max(2, min((width - thick) // 2, (height - thick) // 4)))
    x0 = rng.randint(0, width - 2 * cell - thick)
    y0 = rng.randint(0, height - 4 * cell - thick)
    return (rng.randrange(10), width, height, *_colours(rng), x0, y0, cell, thick)


def _count_spec(rng: random.Random, max_count: int) -> tuple[int, ...]:
    count = rng.randint(1, max_count)
    while True:  # a crowded layout is redrawn; a few draws always suffice for these sizes
        width, height = rng.choice(IMAGE_SIZES), rng.choice(IMAGE_SIZES)
        side = rng.randint(3, 5)
        placed: list[tuple[int, int]] = []
        for _ in range(100):
            x, y = rng.randint(0, width - side), rng.randint(0, height - side)
            # one pixel of gap keeps squares countable
            if all(abs(x - px) > side or abs(y - py) > side for px, py in placed):
                placed.append((x, y))
                if len(placed) == count:
                    return (count, width, height, *_colours(rng), side, *[c for xy in placed for c in xy])


class VisualTask:
    """Deterministic generator of visual problems of one kind.

    ``max_count`` is the most squares of a ``"count"`` problem (2 to 6).

    Raises:
        ValueError: Unknown kind or ``max_count`` out of range.
    """

    def __init__(self, kind: str = "digit", seed: int = 0, max_count: int = 4) -> None:
        if kind not in KINDS:
            raise ValueError(f"VisualTask: kind {kind!r} not in {KINDS}")
        if not 2 <= max_count <= 6:
            raise ValueError(f"VisualTask: max_count must be in [2, 6], got {max_count}")
        self.kind = kind
        self.seed = seed
        self.max_count = max_count

    def _draw(self, n: int, eval_part: bool) -> list[VisualProblem]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"VisualTask: number of problems must be an int >= 0, got {n!r}")
        name = "eval" if eval_part else "train"
        rng = random.Random(f"visual-{self.kind}-{name}-{self.seed}")
        seen: set[tuple[int, ...]] = set()
        out: list[VisualProblem] = []
        attempts = 0
        while len(out) < n:
            attempts += 1
            if attempts > 200 * (n + 10):
                raise ValueError(f"VisualTask: could not draw {n} distinct {name} problems")
            spec = _count_spec(rng, self.max_count) if self.kind == "count" else _digit_spec(rng)
            if spec in seen or _is_eval(self.kind, spec) != eval_part:
                continue
            seen.add(spec)
            answer = COLOUR_NAMES[spec[3]] if self.kind == "colour" else str(spec[0])
            out.append(VisualProblem(self.kind, spec, QUESTIONS[self.kind], answer))
        return out

    def train_problems(self, n: int) -> list[VisualProblem]:
        """``n`` distinct training problems, in a seed-determined order."""
        return self._draw(n, eval_part=False)

    def eval_problems(self, n: int) -> list[VisualProblem]:
        """``n`` distinct held-out problems (disjoint from every train set)."""
        return self._draw(n, eval_part=True)


def exact_match_reward(response: str, answer: str) -> float:
    """1.0 when the response, stripped of surrounding whitespace, equals the answer, else 0.0."""
    return 1.0 if response.strip() == str(answer).strip() else 0.0
