"""Predicting a request's output length online, for the policies that order by it.

DuetInfer (Yang et al., §III-D) predicts the decode length with a linear regression on
the prompt length fitted per modality; H-MAS (§3.2) predicts it per request (with a
fine-tuned model there). One :class:`LengthPredictor` serves the policies that need a
prediction: an online least-squares line
``output ≈ a + b · prompt`` per key, learned from finished requests, where a key is
``(agent, modality)``, falling back to the modality, then to every request, until a
key has seen ``min_samples`` finished requests. A prediction is clamped to
``[1, max_tokens]``: a request cannot produce more than it asked for.

Its error is measured as it goes: before each observation is learned, the prediction
it would have had is compared with the truth, and the mean absolute error and the
mean relative error are kept (:attr:`LengthPredictor.error`).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.policies.predict import LengthPredictor
    >>> p = LengthPredictor(min_samples=2)
    >>> who = fa.Agent("writer", fa.App("docs"))
    >>> for prompt, out in [(10, 25), (20, 45), (30, 65)]:
    ...     p.observe(who, fa.Modality.TEXT, prompt, out)
    >>> p.predict(who, fa.Modality.TEXT, prompt_tokens=40, max_tokens=500)
    85
    >>> p.predict(who, fa.Modality.TEXT, prompt_tokens=40, max_tokens=50)   # never more than it may produce
    50
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from fairagents.identity import Agent, Modality

__all__ = ["LengthPredictor", "PredictionError"]


@dataclass(slots=True)
class _Line:
    """Running sums of an online least-squares fit of y on x."""

    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def add(self, x: float, y: float) -> None:
        self.n += 1
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.sxy += x * y

    def at(self, x: float) -> float:
        mean_x, mean_y = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mean_x * mean_x
        if var <= 1e-9:  # every prompt the same length so far: the mean is the best line
            return mean_y
        slope = (self.sxy / self.n - mean_x * mean_y) / var
        return mean_y + slope * (x - mean_x)


@dataclass(slots=True)
class PredictionError:
    """How far the predictions were from the lengths observed (each measured before it was learned)."""

    samples: int = 0
    absolute: float = 0.0
    relative: float = 0.0

    @property
    def mean_absolute(self) -> float:
        """Mean |predicted − observed| in tokens."""
        return self.absolute / self.samples if self.samples else 0.0

    @property
    def mean_relative(self) -> float:
        """Mean |predicted − observed| / observed."""
        return self.relative / self.samples if self.samples else 0.0


class LengthPredictor:
    """Online output-length prediction per ``(agent, modality)``, falling back to the modality and to all.

    Args:
        min_samples: finished requests a key needs before its own line is used.
        default: the prediction before anything was observed, as a share of ``max_tokens``.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.policies.predict import LengthPredictor
        >>> LengthPredictor().predict(fa.Agent("a", fa.App("x")), fa.Modality.TEXT, 10, max_tokens=200)
        100
    """

    def __init__(self, *, min_samples: int = 5, default: float = 0.5) -> None:
        self.min_samples = min_samples
        self.default = default
        self.error = PredictionError()
        self._lines: dict[Hashable, _Line] = {}

    def predict(self, agent: Agent, modality: Modality, prompt_tokens: int, max_tokens: int) -> int:
        """The expected output tokens of a request, in ``[1, max_tokens]``."""
        for key in ((agent.key, modality), modality, None):
            line = self._lines.get(key)
            if line is not None and line.n >= self.min_samples:
                guess = line.at(prompt_tokens)
                break
        else:
            guess = self.default * max_tokens
        return max(1, min(max_tokens, round(guess)))

    def informed(self, agent: Agent, modality: Modality) -> bool:
        """Whether :meth:`predict` has learned a line to use here: the agent's and modality's own, the
        modality's, or every request's (else it guesses ``default × max_tokens``)."""
        return any((line := self._lines.get(key)) is not None and line.n >= self.min_samples
                   for key in ((agent.key, modality), modality, None))

    def observe(self, agent: Agent, modality: Modality, prompt_tokens: int, output_tokens: int,
                max_tokens: int | None = None) -> None:
        """Learn a finished request's output length (its error is measured first)."""
        guess = self.predict(agent, modality, prompt_tokens, max_tokens if max_tokens is not None else 1 << 30)
        self.error.samples += 1
        self.error.absolute += abs(guess - output_tokens)
        self.error.relative += abs(guess - output_tokens) / max(output_tokens, 1)
        for key in ((agent.key, modality), modality, None):
            self._lines.setdefault(key, _Line()).add(prompt_tokens, output_tokens)
