"""Length distributions of benchmark scenarios: token counts of prompts and outputs, seeded and vectorised.

A length distribution gives ``n`` token counts (integers in ``[1, MAX_LENGTH]``), drawing only from a
:class:`numpy.random.Generator`, so the same seed gives the same draws:
:class:`Constant`, :class:`Uniform`, :class:`Normal`, :class:`LogNormal`,
:class:`Empirical` (observed values, or a file of them) and :class:`Mixture`. Their
arrival-time counterparts are in :mod:`fairagents.bench.arrivals`.

Examples:
    >>> import numpy as np
    >>> from fairagents.bench.lengths import LogNormal
    >>> lengths = LogNormal(median=100, sigma=0.5, max=400).sample(np.random.default_rng(0), 1000)
    >>> int(lengths.min()) >= 1, int(lengths.max()) <= 400
    (True, True)
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from fairagents.errors import InvalidParameterError

__all__ = [
    "MAX_LENGTH",
    "Constant",
    "Empirical",
    "LengthDistribution",
    "LogNormal",
    "Mixture",
    "Normal",
    "Uniform",
]


MAX_LENGTH = 2**31 - 1
"""The longest length a distribution gives or takes (tokens): larger counts mean nothing to a model."""


@runtime_checkable
class LengthDistribution(Protocol):
    """Token counts of prompts or outputs.

    Contract: :meth:`sample` returns ``n`` integers ≥ 1 (``int64``), drawing only from ``rng``.
    """

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths (tokens, ≥ 1)."""
        ...


def _positive(value: float, what: str, *, zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero):
        raise InvalidParameterError(f"{what} must be a finite number {'≥' if zero else '>'} 0, got {value!r}")


def _length(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 1 <= value <= MAX_LENGTH:
        raise InvalidParameterError(f"{what} must be an integer in [1, {MAX_LENGTH}], got {value!r}")
    return int(value)


def _clip(values: np.ndarray, low: int, high: int | None) -> np.ndarray:
    # Clipped while still floats: a draw past int64 (or an infinite one) must not wrap around when cast.
    out = np.clip(np.rint(values), max(1, low), MAX_LENGTH if high is None else min(high, MAX_LENGTH))
    return out.astype(np.int64)


def _bounds(low: int, high: int | None) -> None:
    _length(low, "min")
    if high is not None and _length(high, "max") < low:
        raise InvalidParameterError(f"max ({high}) must be ≥ min ({low})")


@dataclass(frozen=True, slots=True)
class Constant:
    """Always ``value`` tokens.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.lengths import Constant
        >>> Constant(256).sample(np.random.default_rng(0), 3).tolist()
        [256, 256, 256]
    """

    value: int
    """Tokens (≥ 1)."""

    def __post_init__(self) -> None:
        _length(self.value, "a constant length")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths."""
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers uniform on ``[low, high]``, both included.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.lengths import Uniform
        >>> sorted(set(Uniform(3, 5).sample(np.random.default_rng(0), 100).tolist()))
        [3, 4, 5]
    """

    low: int
    """Fewest tokens (≥ 1)."""
    high: int
    """Most tokens (≥ low)."""

    def __post_init__(self) -> None:
        _length(self.low, "low")
        if _length(self.high, "high") < self.low:
            raise InvalidParameterError(f"high ({self.high}) must be ≥ low ({self.low})")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths."""
        return rng.integers(self.low, self.high + 1, n, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Normal:
    """A normal distribution rounded to integers and clipped to ``[min, max]``.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.lengths import Normal
        >>> draws = Normal(mean=100.0, std=10.0, max=110).sample(np.random.default_rng(0), 1000)
        >>> int(draws.max()), bool(95 < draws.mean() < 100)
        (110, True)
    """

    mean: float
    """Mean tokens before clipping (> 0)."""
    std: float
    """Standard deviation (tokens, ≥ 0)."""
    min: int = 1
    """Fewest tokens (≥ 1)."""
    max: int | None = None
    """Most tokens, if bounded."""

    def __post_init__(self) -> None:
        _positive(self.mean, "normal mean")
        _positive(self.std, "normal std", zero=True)
        _bounds(self.min, self.max)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths."""
        return _clip(rng.normal(self.mean, self.std, n), self.min, self.max)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A log-normal distribution (``median`` = e^mu), rounded and clipped to ``[min, max]``.

    Give the median, or ``mu`` (the mean of the log); ``sigma`` is the standard deviation
    of the log. The mean before clipping is ``median · e^(sigma²/2)``.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.lengths import LogNormal
        >>> draws = LogNormal(median=50, sigma=1.0).sample(np.random.default_rng(0), 10_000)
        >>> int(np.median(draws))
        50
    """

    sigma: float
    """Standard deviation of the log (≥ 0)."""
    median: float | None = None
    """Median tokens before clipping (> 0), or give ``mu``."""
    mu: float | None = None
    """Mean of the log, or give ``median``."""
    min: int = 1
    """Fewest tokens (≥ 1)."""
    max: int | None = None
    """Most tokens, if bounded."""

    def __post_init__(self) -> None:
        _positive(self.sigma, "lognormal sigma", zero=True)
        if (self.median is None) == (self.mu is None):
            raise InvalidParameterError("a lognormal length needs exactly one of median and mu")
        if self.median is not None:
            _positive(self.median, "lognormal median")
        elif not math.isfinite(self.mu):  # type: ignore[arg-type]
            raise InvalidParameterError(f"lognormal mu must be finite, got {self.mu!r}")
        _bounds(self.min, self.max)

    @property
    def location(self) -> float:
        """``mu``, the mean of the log."""
        return math.log(self.median) if self.median is not None else float(self.mu)  # type: ignore[arg-type]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths."""
        return _clip(rng.lognormal(self.location, self.sigma, n), self.min, self.max)


@dataclass(frozen=True, slots=True)
class Empirical:
    """Lengths drawn with replacement from observed values (:meth:`from_file` reads them).

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.lengths import Empirical
        >>> sorted(set(Empirical((10, 20)).sample(np.random.default_rng(0), 50).tolist()))
        [10, 20]
    """

    values: tuple[int, ...]
    """The observed lengths (each ≥ 1)."""

    def __post_init__(self) -> None:
        if not self.values:
            raise InvalidParameterError("an empirical length needs at least one value")
        object.__setattr__(self, "values", tuple(_length(v, "an empirical length") for v in self.values))

    @classmethod
    def from_file(cls, path: str | Path, column: str | int | None = None) -> Empirical:
        """Values from a file: one integer a line, or, with ``column``, a CSV column (a header name or an index).

        Blank lines and lines starting with ``#`` are skipped in the one-a-line form.

        Examples:
            >>> import tempfile, pathlib
            >>> from fairagents.bench.lengths import Empirical
            >>> folder = pathlib.Path(tempfile.mkdtemp())
            >>> _ = (folder / "lens.csv").write_text("prompt,output\\n12,30\\n40,7\\n")
            >>> Empirical.from_file(folder / "lens.csv", column="output").values
            (30, 7)
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise InvalidParameterError(f"cannot read lengths from {path}: {err.strerror or err}") from None
        except UnicodeDecodeError as err:
            raise InvalidParameterError(f"cannot read lengths from {path}: not UTF-8 text (byte {err.start})") from None
        try:
            values = _parse(path, text, column)
        except csv.Error as err:
            raise InvalidParameterError(f"cannot read lengths from {path}: {err}") from None
        if not values:
            raise InvalidParameterError(f"{path} holds no lengths")
        return cls(tuple(values))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths."""
        return rng.choice(np.asarray(self.values, dtype=np.int64), n)


def _parse(path: Path, text: str, column: str | int | None) -> list[int]:
    """The lengths in a file's text: one a line, or a CSV column."""
    values = []
    if column is None:
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if line and not line.startswith("#"):
                values.append(_parse_int(line, f"{path}:{number}"))
    else:
        rows = list(csv.reader(text.splitlines()))
        if not rows:
            raise InvalidParameterError(f"{path} is empty")
        header = [h.strip() for h in rows[0]]
        if isinstance(column, int):
            index = column
            if not 0 <= index < len(header):
                raise InvalidParameterError(f"{path} has {len(header)} columns, no column {column}")
        elif column in header:
            index = header.index(column)
        else:
            raise InvalidParameterError(f"{path} has no column {column!r}; its columns: {', '.join(header)}")
        for number, row in enumerate(rows[1:], 2):
            if row and any(cell.strip() for cell in row):
                if index >= len(row):
                    raise InvalidParameterError(f"{path}:{number}: no value in column {column!r}")
                values.append(_parse_int(row[index].strip(), f"{path}:{number}"))
    return values


def _parse_int(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:  # not an integer, or one of more than 4,300 digits
        raise InvalidParameterError(f"{where}: a length must be an integer in [1, {MAX_LENGTH}], got {text[:40]!r}"
                                    ) from None
    if not 1 <= value <= MAX_LENGTH:
        raise InvalidParameterError(f"{where}: a length must be an integer in [1, {MAX_LENGTH}], got {text[:40]}")
    return value


@dataclass(frozen=True, slots=True)
class Mixture:
    """Each length from one of several distributions, chosen with probability proportional to its weight.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.lengths import Constant, Mixture
        >>> draws = Mixture(((1.0, Constant(10)), (3.0, Constant(1000)))).sample(np.random.default_rng(0), 4000)
        >>> 0.2 < float(np.mean(draws == 10)) < 0.3
        True
    """

    parts: tuple[tuple[float, LengthDistribution], ...]
    """``(weight, distribution)`` pairs; weights > 0."""

    def __post_init__(self) -> None:
        if not self.parts:
            raise InvalidParameterError("a mixture needs at least one part")
        for weight, _ in self.parts:
            _positive(weight, "a mixture weight")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` lengths."""
        weights = np.array([w for w, _ in self.parts], dtype=float)
        which = rng.choice(len(self.parts), n, p=weights / weights.sum())
        out = np.empty(n, dtype=np.int64)
        for i, (_, dist) in enumerate(self.parts):
            chosen = which == i
            out[chosen] = dist.sample(rng, int(chosen.sum()))
        return out
