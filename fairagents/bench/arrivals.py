"""Arrival processes of benchmark scenarios, seeded and vectorised.

An arrival process gives one client's arrival times (seconds) over a window
``[start, end)``, drawing only from a :class:`numpy.random.Generator`, so the same seed
gives the same draws. The token counts of the requests come from the length
distributions of :mod:`fairagents.bench.lengths`.

Arrival processes:

- :class:`Poisson` — exponential gaps of mean ``1 / rate``;
- :class:`Gamma` — gamma gaps of mean ``1 / rate`` and coefficient of variation ``cv``
  (``cv = 1`` is Poisson; ``cv = 0`` evenly spaced, at a random phase);
- :class:`OnOff` — a base process that runs for ``on`` seconds, then is silent for
  ``off`` seconds, and so on (its clock pauses while off);
- :class:`ExFairSRounds` — ExFairS' client: rounds of ``round`` seconds, each sending its
  QPM's requests at gaps ~ Normal(60/QPM, cv·60/QPM) truncated at 0, compressed into the
  first ``send_window`` seconds of the round;
- :class:`Piecewise`, :class:`Formula` and :class:`HMASStress` — inhomogeneous Poisson
  processes of a rate λ(t) given as segments, as a formula in ``t``, or as H-MAS eq. 13
  (:func:`hmas_stress_rate`), sampled by thinning (piecewise: exactly per segment).

Examples:
    >>> import numpy as np
    >>> from fairagents.bench.arrivals import Poisson
    >>> times = Poisson(rate=5.0).times(np.random.default_rng(0), 0.0, 100.0)
    >>> 400 < len(times) < 600, bool(np.all(np.diff(times) >= 0))
    (True, True)
"""

from __future__ import annotations

import ast
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

import numpy as np

from fairagents.errors import InvalidParameterError

__all__ = [
    "ArrivalProcess",
    "ExFairSRounds",
    "Formula",
    "Gamma",
    "HMASStress",
    "OnOff",
    "Piecewise",
    "Poisson",
    "hmas_stress_rate",
    "parse_rate_formula",
]

RateFunction = Callable[[np.ndarray], np.ndarray]


@runtime_checkable
class ArrivalProcess(Protocol):
    """When one client's requests arrive.

    Contract: :meth:`times` returns sorted arrival times in ``[start, end)``, drawing only
    from ``rng`` (the same generator state gives the same times); :meth:`scaled` returns
    the process with every rate multiplied by ``factor`` (> 0), the shape kept.
    """

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times (seconds) in ``[start, end)``."""
        ...

    def scaled(self, factor: float) -> ArrivalProcess:
        """The same process with its rates multiplied by ``factor``."""
        ...


def _positive(value: float, what: str, *, zero: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero):
        raise InvalidParameterError(f"{what} must be a finite number {'≥' if zero else '>'} 0, got {value!r}")


def _window(start: float, end: float) -> None:
    if not (math.isfinite(start) and math.isfinite(end)):
        raise InvalidParameterError(f"an arrival window must be finite, got [{start}, {end})")


def _homogeneous(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    """A Poisson process of ``rate`` on ``[start, end)``: a Poisson count, placed uniformly."""
    if end <= start or rate <= 0:
        return np.empty(0)
    n = rng.poisson(rate * (end - start))
    return np.sort(rng.uniform(start, end, n))


# --------------------------------------------------------------------------- arrival processes


@dataclass(frozen=True, slots=True)
class Poisson:
    """A Poisson process: exponential gaps of mean ``1 / rate`` (CV 1).

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.arrivals import Poisson
        >>> len(Poisson(rate=2.0).times(np.random.default_rng(1), 0.0, 1000.0))
        2001
    """

    rate: float
    """Requests per second (> 0)."""

    def __post_init__(self) -> None:
        _positive(self.rate, "Poisson rate")

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times in ``[start, end)``."""
        _window(start, end)
        return _homogeneous(rng, self.rate, start, end)

    def scaled(self, factor: float) -> Poisson:
        """The process at ``factor`` times the rate."""
        return replace(self, rate=self.rate * factor)


@dataclass(frozen=True, slots=True)
class Gamma:
    """A renewal process of gamma gaps: mean ``1 / rate``, coefficient of variation ``cv``.

    ``cv = 1`` is Poisson; larger is burstier; ``cv = 0`` sends evenly every ``1 / rate``
    seconds from a random phase (VTC's "uniform" clients). VTC's artifact draws gaps of
    shape ``1 / cv²`` and scale ``cv² / rate``, the first one after ``start``; so does this.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.arrivals import Gamma
        >>> times = Gamma(rate=2.0, cv=0.0).times(np.random.default_rng(0), 0.0, 5.0)
        >>> np.diff(times).round(6).tolist()
        [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    """

    rate: float
    """Requests per second (> 0)."""
    cv: float = 1.0
    """Coefficient of variation of the gaps (≥ 0)."""

    def __post_init__(self) -> None:
        _positive(self.rate, "gamma rate")
        _positive(self.cv, "gamma cv", zero=True)

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times in ``[start, end)``."""
        _window(start, end)
        if end <= start:
            return np.empty(0)
        if self.cv == 0:
            first = start + rng.random() / self.rate
            return first + np.arange(max(0, math.ceil((end - first) * self.rate))) / self.rate
        shape, scale = 1.0 / self.cv**2, self.cv**2 / self.rate
        chunks, t = [], start
        expected = self.rate * (end - start)
        while t < end:
            gaps = rng.gamma(shape, scale, int(expected * 1.1) + 16)
            arrivals = t + np.cumsum(gaps)
            chunks.append(arrivals)
            t = float(arrivals[-1])
        out = np.concatenate(chunks)
        return out[out < end]

    def scaled(self, factor: float) -> Gamma:
        """The process at ``factor`` times the rate (same CV)."""
        return replace(self, rate=self.rate * factor)


@dataclass(frozen=True, slots=True)
class OnOff:
    """``base`` runs for ``on`` seconds, then nothing for ``off`` seconds, repeating from ``start``.

    The base process runs on a clock that pauses while off, so a renewal process keeps
    its gaps across a pause. The duty cycle is ``on / (on + off)``; while on, the rate is
    the base's.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.arrivals import OnOff, Poisson
        >>> times = OnOff(Poisson(rate=10.0), on=5.0, off=5.0).times(np.random.default_rng(0), 0.0, 20.0)
        >>> bool(np.all((times % 10.0) < 5.0))
        True
    """

    base: ArrivalProcess
    """The process while on."""
    on: float
    """Seconds on (> 0)."""
    off: float
    """Seconds off (≥ 0)."""

    def __post_init__(self) -> None:
        _positive(self.on, "on-period")
        _positive(self.off, "off-period", zero=True)

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times in ``[start, end)``."""
        _window(start, end)
        if end <= start:
            return np.empty(0)
        period = self.on + self.off
        cycles, rest = divmod(end - start, period)
        active = cycles * self.on + min(rest, self.on)
        local = self.base.times(rng, 0.0, active)
        k = np.floor(local / self.on)
        out = start + k * period + (local - k * self.on)
        return out[out < end]

    def scaled(self, factor: float) -> OnOff:
        """The process with the base's rate multiplied by ``factor`` (same periods)."""
        return replace(self, base=self.base.scaled(factor))


@dataclass(frozen=True, slots=True)
class ExFairSRounds:
    """An ExFairS benchmark client: rounds of ``round`` seconds at ``qpm`` queries per minute.

    Each round (the first at ``start``) plans ``round · qpm / 60`` requests (rounded at
    random to an integer, so exact for the paper's integer QPMs over 60 s rounds) with gaps
    ~ Normal(60/qpm, cv · 60/qpm) truncated at 0, compressed by ``send_window / round``, and
    sends them all within the first ``send_window`` seconds: gaps that would overrun it are
    compressed further, by ``send_window`` over their sum. While sending, the rate is about
    ``round / send_window`` (1.25 for 48 of 60 s) times the QPM. :meth:`scaled` below 1 keeps
    each request with that probability (``keep``) rather than lowering the QPM, whose longer
    gaps would crowd the window.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.arrivals import ExFairSRounds
        >>> times = ExFairSRounds(qpm=30.0, rounds=2).times(np.random.default_rng(0), 0.0, 600.0)
        >>> len(times), bool(np.all(times % 60.0 <= 48.0)), float(times.max()) < 120.0
        (60, True, True)
    """

    qpm: float
    """Queries per minute (> 0)."""
    round: float = 60.0
    """Seconds per round (> 0)."""
    send_window: float = 48.0
    """Seconds at the start of each round in which its requests are sent (0 < send_window ≤ round)."""
    rounds: int | None = None
    """Rounds to play; ``None``: as many as start before the window ends."""
    cv: float = 0.3
    """Standard deviation of a gap over its mean (≥ 0)."""
    keep: float = 1.0
    """Probability that a planned request is sent, in (0, 1]."""

    def __post_init__(self) -> None:
        _positive(self.qpm, "QPM")
        _positive(self.keep, "keep")
        if self.keep > 1:
            raise InvalidParameterError(f"keep must be a probability in (0, 1], got {self.keep!r}")
        _positive(self.round, "round length")
        _positive(self.send_window, "send window")
        _positive(self.cv, "ExFairS gap cv", zero=True)
        if self.send_window > self.round:
            raise InvalidParameterError(f"send_window ({self.send_window}) must not exceed the round ({self.round})")
        if self.rounds is not None and (isinstance(self.rounds, bool) or not isinstance(self.rounds, int)
                                        or self.rounds < 1):
            raise InvalidParameterError(f"rounds must be an integer ≥ 1 or None, got {self.rounds!r}")

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times in ``[start, end)``."""
        _window(start, end)
        gap = 60.0 / self.qpm
        planned = self.round * self.qpm / 60.0
        compression = self.send_window / self.round
        chunks = []
        k = 0
        while start + k * self.round < end and (self.rounds is None or k < self.rounds):
            n = math.floor(planned) + int(rng.random() < planned - math.floor(planned))
            offsets = np.cumsum(np.maximum(rng.normal(gap, self.cv * gap, n), 0.0) * compression)
            if n and offsets[-1] > self.send_window:  # about every other round: squeeze it into the window
                offsets = offsets / offsets[-1] * self.send_window  # the last exactly at the window's end
            if self.keep < 1:
                offsets = offsets[rng.random(n) < self.keep]
            chunks.append(start + k * self.round + offsets)
            k += 1
        out = np.concatenate(chunks) if chunks else np.empty(0)
        return out[out < end]

    def scaled(self, factor: float) -> ExFairSRounds:
        """The client at ``factor`` times the rate: more QPM above 1, fewer requests kept below (same rounds)."""
        _positive(factor, "scale factor")
        total = self.keep * factor
        return replace(self, keep=total) if total <= 1 else replace(self, qpm=self.qpm * total, keep=1.0)


def _thin(
    rng: np.random.Generator, rate: RateFunction, bound: float, start: float, end: float, what: str
) -> np.ndarray:
    """An inhomogeneous Poisson process of ``rate`` by thinning one of rate ``bound`` ≥ λ(t)."""
    candidates = _homogeneous(rng, bound, start, end)
    if not len(candidates):
        return candidates
    lam = _checked(rate(candidates), candidates, what)
    if np.any(lam > bound * (1 + 1e-9)):
        t = float(candidates[np.argmax(lam > bound * (1 + 1e-9))])
        raise InvalidParameterError(
            f"{what} exceeds its bound {bound:g} (at t={t:g}); give rate_max, an upper bound of the rate")
    return candidates[rng.random(len(candidates)) * bound < lam]


def _checked(lam: np.ndarray, t: np.ndarray, what: str) -> np.ndarray:
    lam = np.broadcast_to(np.asarray(lam, dtype=float), t.shape)
    bad = ~np.isfinite(lam) | (lam < 0)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise InvalidParameterError(f"{what} must be a finite rate ≥ 0, got {lam[i]!r} at t={t[i]:g}")
    return lam


@dataclass(frozen=True, slots=True)
class Piecewise:
    """A Poisson process whose rate is constant on segments ``(start, end, rate)`` and 0 elsewhere.

    Segments are in scenario time (seconds) and must not overlap.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.arrivals import Piecewise
        >>> p = Piecewise(((0.0, 10.0, 5.0), (10.0, 20.0, 0.0)))
        >>> float(p.times(np.random.default_rng(0), 0.0, 20.0).max()) < 10.0
        True
        >>> p.rate_at(np.array([5.0, 15.0, 25.0])).tolist()
        [5.0, 0.0, 0.0]
    """

    segments: tuple[tuple[float, float, float], ...]
    """``(start, end, rate)``: requests per second on ``[start, end)``."""
    factor: float = 1.0
    """Multiplies every rate."""

    def __post_init__(self) -> None:
        segments = tuple(sorted((float(a), float(b), float(r)) for a, b, r in self.segments))
        if not segments:
            raise InvalidParameterError("a piecewise rate needs at least one segment")
        for a, b, r in segments:
            _positive(r, "a segment's rate", zero=True)
            if not (math.isfinite(a) and math.isfinite(b)) or b <= a:
                raise InvalidParameterError(f"a segment must have start < end, got [{a:g}, {b:g})")
        for (_, b, _), (a, _, _) in itertools.pairwise(segments):
            if a < b:
                raise InvalidParameterError(f"rate segments overlap at t={a:g}")
        _positive(self.factor, "rate factor")
        object.__setattr__(self, "segments", segments)

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        """λ(t), requests per second."""
        t = np.asarray(t, dtype=float)
        out = np.zeros_like(t)
        for a, b, r in self.segments:
            out = np.where((t >= a) & (t < b), r * self.factor, out)
        return out

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times in ``[start, end)`` (each segment drawn exactly)."""
        _window(start, end)
        parts = [_homogeneous(rng, r * self.factor, max(a, start), min(b, end)) for a, b, r in self.segments]
        return np.concatenate(parts)

    def scaled(self, factor: float) -> Piecewise:
        """The process at ``factor`` times the rate."""
        return replace(self, factor=self.factor * factor)


_BINARY = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide,
           ast.Mod: np.mod, ast.Pow: np.power}
_COMPARE = {ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater, ast.GtE: np.greater_equal,
            ast.Eq: np.equal, ast.NotEq: np.not_equal}
_CALLS = {"min": np.minimum, "max": np.maximum}
_ALLOWED = "numbers, t, + - * / % **, comparisons, min(…), max(…) and 'a if condition else b'"
_MAX_FORMULA = 2000
_MAX_DEPTH = 100  # nesting of the parsed formula: compiling and evaluating it recurse this deep


def parse_rate_formula(expr: str) -> RateFunction:
    """Compile a rate formula in ``t`` (seconds) into a vectorised function, refusing anything else.

    Allowed: numbers, the name ``t``, ``+ - * / % **`` and unary ``-``/``+``, comparisons
    (chained too: ``200 <= t < 400``), ``min(a, b, …)``, ``max(a, b, …)`` and
    ``a if condition else b``. Nothing is ``eval``-ed: the expression is parsed with
    :mod:`ast` and only those nodes are compiled, to numpy operations.

    Raises:
        InvalidParameterError: a syntax error; a name, call or operation outside the list; a
            number too large for a float; a formula longer than 2,000 characters or nested
            more than 100 operations deep.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.arrivals import parse_rate_formula
        >>> rate = parse_rate_formula("72 if t % 20 < 10 else 8")
        >>> rate(np.array([0.0, 15.0])).tolist()
        [72.0, 8.0]
        >>> parse_rate_formula("__import__('os')")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: rate formula may only use numbers, t, ...; found a call of __import__
    """
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidParameterError(f"a rate formula must be a non-empty string, got {expr!r}")
    if len(expr) > _MAX_FORMULA:
        raise InvalidParameterError(f"a rate formula may be at most {_MAX_FORMULA} characters long")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as err:
        raise InvalidParameterError(f"rate formula {expr!r} is not an expression: {err.msg}") from None
    except (RecursionError, MemoryError):
        raise _too_deep() from None
    if _depth(tree.body) > _MAX_DEPTH:
        raise _too_deep()
    try:
        compiled = _compile(tree.body)
    except (RecursionError, MemoryError):  # the depth cap should prevent it; never a traceback all the same
        raise _too_deep() from None

    def rate(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        with np.errstate(all="ignore"):  # a division by zero becomes inf, refused by the caller
            return np.broadcast_to(np.asarray(compiled(t), dtype=float), t.shape)

    return rate


def _too_deep() -> InvalidParameterError:
    return InvalidParameterError(f"a rate formula may nest at most {_MAX_DEPTH} operations deep; "
                                 "split a long sum with parentheses or use a piecewise rate")


def _depth(tree: ast.AST) -> int:
    """How deep ``tree`` nests, counted without recursion (a long chain of ``+`` is as deep as it is long)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > _MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _refuse(what: str) -> InvalidParameterError:
    return InvalidParameterError(f"rate formula may only use {_ALLOWED}; found {what}")


def _compile(node: ast.expr) -> Callable[[np.ndarray], np.ndarray]:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _refuse(f"the constant {value!r}")
        try:
            number = float(value)
        except OverflowError:
            raise InvalidParameterError(f"rate formula has a number too large for a float: {str(value)[:12]}…"
                                        ) from None
        return lambda t: np.full_like(t, number)
    if isinstance(node, ast.Name):
        if node.id != "t":
            raise _refuse(f"the name {node.id!r}")
        return lambda t: t
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        op, left, right = _BINARY[type(node.op)], _compile(node.left), _compile(node.right)
        return lambda t: op(left(t), right(t))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand, sign = _compile(node.operand), -1.0 if isinstance(node.op, ast.USub) else 1.0
        return lambda t: sign * operand(t)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        terms = [_compile(node.left), *(_compile(c) for c in node.comparators)]
        ops = [_COMPARE[type(op)] for op in node.ops]

        def compare(t: np.ndarray) -> np.ndarray:
            values = [term(t) for term in terms]
            result = np.ones_like(t, dtype=bool)
            for op, (a, b) in zip(ops, itertools.pairwise(values), strict=True):
                result &= op(a, b)
            return result.astype(float)

        return compare
    if isinstance(node, ast.IfExp):
        test, body, orelse = _compile(node.test), _compile(node.body), _compile(node.orelse)
        return lambda t: np.where(test(t) != 0, body(t), orelse(t))
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        if name not in _CALLS or node.keywords or len(node.args) < 2:
            raise _refuse(f"a call of {name}" if name not in _CALLS else f"{name}() with fewer than 2 arguments")
        fn, args = _CALLS[name], [_compile(a) for a in node.args]

        def call(t: np.ndarray) -> np.ndarray:
            result = args[0](t)
            for arg in args[1:]:
                result = fn(result, arg(t))
            return result

        return call
    raise _refuse(f"'{ast.unparse(node)}'")


@dataclass(frozen=True, slots=True)
class Formula:
    """A Poisson process whose rate λ(t) is a formula in scenario time ``t`` (:func:`parse_rate_formula`).

    Sampled by thinning a process of rate ``rate_max``, by default the largest value of
    the formula on a 10 ms grid over the window, plus 1 %. A formula that peaks more
    sharply than that needs ``rate_max``; one that exceeds it raises.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.arrivals import Formula
        >>> f = Formula("10 if t < 50 else 0")
        >>> times = f.times(np.random.default_rng(0), 0.0, 100.0)
        >>> float(times.max()) < 50.0, 400 < len(times) < 600
        (True, True)
    """

    expr: str
    """The formula: requests per second as a function of ``t`` (seconds)."""
    rate_max: float | None = None
    """An upper bound of the rate over the window (requests per second), if the default does not hold."""
    factor: float = 1.0
    """Multiplies the rate."""
    _rate: RateFunction = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rate", parse_rate_formula(self.expr))
        if self.rate_max is not None:
            _positive(self.rate_max, "rate_max")
        _positive(self.factor, "rate factor")

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        """λ(t), requests per second."""
        t = np.asarray(t, dtype=float)
        return _checked(self._rate(t), t, f"rate formula {self.expr!r}") * self.factor

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times in ``[start, end)``."""
        _window(start, end)
        if end <= start:
            return np.empty(0)
        if self.rate_max is not None:
            bound = self.rate_max * self.factor
        else:
            grid = np.linspace(start, end, int(min(1_000_001, max(1001, math.ceil((end - start) / 0.01) + 1))))
            bound = float(self.rate_at(grid).max()) * 1.01
        if bound <= 0:
            return np.empty(0)
        return _thin(rng, self.rate_at, bound, start, end, f"rate formula {self.expr!r}")

    def scaled(self, factor: float) -> Formula:
        """The process at ``factor`` times the rate."""
        return Formula(self.expr, self.rate_max, self.factor * factor)


def hmas_stress_rate(t: float, lam0: float = 40.0) -> float:
    """H-MAS eq. 13, the rate of its 600 s time-varying stress test (requests per second).

    ``0.6·λ0`` on [0, 200); ``1.4·λ0`` on [200, 400); on [400, 600) ``1.8·λ0`` while
    ``t mod 20 < 10``, else ``0.2·λ0``; 0 outside [0, 600).

    Examples:
        >>> from fairagents.bench.arrivals import hmas_stress_rate
        >>> [hmas_stress_rate(t) for t in (0, 199.9, 200, 400, 409.9, 410, 420, 600)]
        [24.0, 24.0, 56.0, 72.0, 72.0, 8.0, 72.0, 0.0]
    """
    if 0 <= t < 200:
        return 0.6 * lam0
    if 200 <= t < 400:
        return 1.4 * lam0
    if 400 <= t < 600:
        return 1.8 * lam0 if t % 20 < 10 else 0.2 * lam0
    return 0.0


@dataclass(frozen=True, slots=True)
class HMASStress:
    """The inhomogeneous Poisson process of H-MAS eq. 13 (:func:`hmas_stress_rate`), in scenario time.

    Eq. 13 is linear in λ0, so agents whose ``lam0`` add up to 40 together send the
    paper's stress test.

    Examples:
        >>> import numpy as np
        >>> from fairagents.bench.arrivals import HMASStress
        >>> HMASStress(lam0=10.0).rate_at(np.array([100.0, 300.0, 405.0, 415.0])).tolist()
        [6.0, 14.0, 18.0, 2.0]
    """

    lam0: float = 40.0
    """λ0 of eq. 13 (requests per second)."""

    def __post_init__(self) -> None:
        _positive(self.lam0, "lam0")

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        """λ(t), requests per second (vectorised :func:`hmas_stress_rate`)."""
        t = np.asarray(t, dtype=float)
        burst = np.where(np.mod(t, 20.0) < 10.0, 1.8, 0.2)
        phases = [(t >= 0) & (t < 200), (t >= 200) & (t < 400), (t >= 400) & (t < 600)]
        level = np.select(phases, [0.6, 1.4, burst], 0.0)
        return level * self.lam0

    def times(self, rng: np.random.Generator, start: float, end: float) -> np.ndarray:
        """Sorted arrival times in ``[start, end)``."""
        _window(start, end)
        return _thin(rng, self.rate_at, 1.8 * self.lam0, start, end, "H-MAS stress rate")

    def scaled(self, factor: float) -> HMASStress:
        """The process at ``factor`` times λ0."""
        return replace(self, lam0=self.lam0 * factor)
