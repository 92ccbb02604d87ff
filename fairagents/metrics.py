"""What a run delivered, to whom: request records, service charges, and fairness metrics.

The records are the same for the simulator and the live arbiter, so one set of
metrics reads both. Service is always counted in unified tokens here, whatever the
policy charged internally, so that policies are compared in one currency.

Examples:
    >>> from fairagents.metrics import jain_index
    >>> jain_index([1.0, 1.0, 1.0]), round(jain_index([1.0, 0.0]), 2)
    (1.0, 0.5)
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

from fairagents.records import RequestRecord
from fairagents.request import Outcome

__all__ = [
    "Charge",
    "ClientSnapshot",
    "RequestRecord",
    "backlog_intervals",
    "client_stats",
    "entitlements",
    "exfairs_jain_index",
    "jain_index",
    "max_service_gap",
    "percentile",
]


@dataclass(frozen=True, slots=True)
class Charge:
    """Service delivered to an agent at an instant, in unified tokens."""

    time: float
    """When (seconds)."""
    app: str
    agent: str
    amount: float
    """Unified tokens, input (at dispatch) or output (as generated) weights applied."""
    model: str | None = None
    """The model that served it (``None``: not said)."""


@dataclass(frozen=True, slots=True)
class ClientSnapshot:
    """One app's or agent's standing: service, outcomes and latency percentiles (unified tokens, seconds).

    The simulator's :meth:`~fairagents.simulation.SimResult.app_stats` and the arbiter's
    :meth:`~fairagents.Arbiter.stats` both report it (percentiles are NaN without samples).

    Examples:
        >>> from fairagents.metrics import Charge, RequestRecord, client_stats
        >>> from fairagents import Outcome
        >>> done = RequestRecord("1", "x", "t", "m", 0.0, 0.5, 0.6, 1.0, 1, 2, Outcome.FINISHED)
        >>> (x,) = client_stats([done], [Charge(0.5, "x", "t", 4.0)], {"x": 1.0})
        >>> x.name, x.service, x.done, x.wait_p50
        ('x', 4.0, 1, 0.5)
    """

    name: str
    """App name, or ``app/agent``."""
    weight: float
    weight_share: float
    """Its weight over the weights of its peers (all apps listed; or its app's agents)."""
    service: float
    """Unified tokens delivered (charged) so far."""
    share: float
    """Its service over its peers' service."""
    done: int
    """Requests that finished."""
    cancelled: int
    wait_p50: float
    wait_p99: float
    ttft_p50: float
    ttft_p99: float
    failed: int = 0
    queued: int = 0
    """Requests waiting now (the arbiter's; 0 once a simulated run has ended)."""
    in_flight: int = 0
    """Requests running now (the arbiter's; 0 once a simulated run has ended)."""
    rejected: int = 0
    """Arrivals refused because its app's queue for the model was full (``max_queued``: the 429);
    counted by the simulator (the server counts the arbiter's in its fairness view)."""
    e2e_p50: float = math.nan
    """Median seconds from arrival to the end, of finished requests."""
    slo_attainment: float | None = None
    """Fraction of finished requests with an SLO that met it (``None``: none had one)."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100, linear interpolation); NaN for no values.

    Examples:
        >>> from fairagents.metrics import percentile
        >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
        2.5
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index ``(Σx)² / (n·Σx²)``: 1 is equal, ``1/n`` is one-takes-all.

    The standard index (Jain, Chiu & Hawe 1984) on the values as given; see
    :func:`exfairs_jain_index` for the normalised variant that the ExFairS authors report.

    Examples:
        >>> from fairagents.metrics import jain_index
        >>> round(jain_index([3.0, 1.0]), 3)
        0.8
    """
    xs = list(values)
    squares = sum(x * x for x in xs)
    return 1.0 if not xs or squares == 0 else sum(xs) ** 2 / (len(xs) * squares)


def exfairs_jain_index(values: Iterable[float], *, smaller_is_better: bool = True) -> float:
    """The Jain's index variant that the ExFairS authors' code reports (e.g. over SAFI values).

    The ExFairS paper (Huang et al., AAAI'26) reports "Jain's Index calculated based on
    SAFI across clients". The authors' code does not apply Jain's formula to the values
    themselves: it first min-max normalises them, ``y = (x − min) / (max − min)``, takes
    ``1 − y`` for a metric where smaller is better (SAFI, an SLO violation rate), and only
    then computes ``(Σy)² / (n·Σy²)``. Equal values (and a single client) score 1.

    How it differs from :func:`jain_index`: the result no longer depends on how far
    apart the values are, only on how they are spread between the extremes. The best
    client always maps to 1 and the worst to 0, so **any two unequal clients score 0.5**,
    whether their values are 0.10 and 0.11 or 0 and 1, and ``n`` clients of which one is
    worse than all the others (equal) score ``(n−1)/n``. It is not comparable with the
    standard index, nor across runs; use :func:`jain_index` (on SAFI, service or SLO
    attainment) to compare policies, and this one only to reproduce the paper's numbers.
    No values score 1, like :func:`jain_index` (the authors' code returns 0 there).

    Args:
        values: one value per client.
        smaller_is_better: whether a smaller value is the better state (SAFI, violation
            rates: ``1 − y`` is taken); ``False`` for a larger-is-better metric (``y`` as is).

    Examples:
        >>> from fairagents.metrics import exfairs_jain_index, jain_index
        >>> exfairs_jain_index([0.10, 0.11]), exfairs_jain_index([0.0, 1.0])   # any two unequal clients
        (0.5, 0.5)
        >>> round(jain_index([0.10, 0.11]), 4)                                    # the standard index: nearly equal
        0.9977
        >>> round(exfairs_jain_index([0.2, 0.2, 0.2, 0.9]), 4)                    # one worse client of four
        0.75
        >>> exfairs_jain_index([0.3, 0.3]), exfairs_jain_index([0.4])
        (1.0, 1.0)
    """
    xs = list(values)
    if len(xs) < 2:
        return 1.0
    lo, hi = min(xs), max(xs)
    if hi == lo:
        return 1.0
    ys = [(x - lo) / (hi - lo) for x in xs]
    if smaller_is_better:
        ys = [1.0 - y for y in ys]
    return jain_index(ys)


def entitlements(served: Mapping[str, float], weights: Mapping[str, float],
                 backlogged: Mapping[str, bool]) -> dict[str, float]:
    """Each client's share of the ``served`` total by weighted max-min fairness, given its demand.

    A client that was not ``backlogged`` asked for what it got: it is entitled to that,
    unless it is more than its weight's part of what is left. The others (those
    backlogged, and any that got more than that part) split what is left by weight. So
    weights decide only between clients that want more, and a client asking less than
    its share is not owed its weight.

    Examples:
        >>> from fairagents.metrics import entitlements
        >>> shares = entitlements({"driving": 15.0, "studio": 45.0, "flood": 40.0},
        ...                       {"driving": 2.0, "studio": 1.0, "flood": 1.0},
        ...                       {"driving": False, "studio": True, "flood": True})
        >>> {c: round(v, 3) for c, v in shares.items()}
        {'driving': 0.15, 'studio': 0.425, 'flood': 0.425}
    """
    total = sum(served.values())
    if total <= 0:
        return {c: 0.0 for c in served}
    left, open_ = total, set(served)
    entitled: dict[str, float] = {}
    while open_:
        weight = sum(weights[c] for c in open_)
        sated = [c for c in open_ if not backlogged.get(c, True) and served[c] <= left * weights[c] / weight]
        if not sated:
            break
        for c in sated:
            entitled[c] = served[c]
            left -= served[c]
            open_.discard(c)
    weight = sum(weights[c] for c in open_)
    for c in open_:
        entitled[c] = left * weights[c] / weight
    return {c: entitled[c] / total for c in served}


def backlog_intervals(
    records: Iterable[RequestRecord], key: str = "app", models: Iterable[str] | None = None
) -> dict[str, list[tuple[float, float]]]:
    """When each client had a waiting request: merged ``[start, end)`` intervals.

    ``key`` is ``"app"`` or ``"agent"`` (clients named ``app/agent``). A request waits
    from arrival until dispatch (or until it ended, if it never was dispatched). With
    ``models``, a client counts as backlogged only while it waits for every one of them.

    Examples:
        >>> from fairagents.metrics import RequestRecord, backlog_intervals
        >>> from fairagents import Outcome
        >>> rec = lambda a, d: RequestRecord("r", "x", "t", "m", a, d, d, d + 1, 1, 1, Outcome.FINISHED)
        >>> backlog_intervals([rec(0.0, 1.0), rec(0.5, 2.0), rec(3.0, 4.0)])
        {'x': [(0.0, 2.0), (3.0, 4.0)]}
    """
    spans: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        end = r.dispatched if r.dispatched is not None else r.finished
        if end > r.arrival:
            spans[(_client(r.app, r.agent, key), r.model)].append((r.arrival, end))
    per_model = {k: _merge(v) for k, v in spans.items()}
    clients = sorted({client for client, _ in per_model})
    if models is None:
        return {c: _merge([iv for (client, _), ivs in per_model.items() if client == c for iv in ivs]) for c in clients}
    out = {}
    for c in clients:
        intervals: list[tuple[float, float]] | None = None
        for m in models:
            these = per_model.get((c, m), [])
            intervals = these if intervals is None else _intersect(intervals, these)
        if intervals:
            out[c] = intervals
    return out


def max_service_gap(
    records: Iterable[RequestRecord],
    charges: Iterable[Charge],
    weights: Mapping[str, float],
    key: str = "app",
    clients: Iterable[str] | None = None,
    models: Iterable[str] | None = None,
) -> float:
    """Largest weight-normalised service difference between two backlogged clients.

    For every pair of clients and every time span during which both stay backlogged,
    the difference ``ΔS_x/w_x − ΔS_y/w_y`` of service received over any sub-interval
    (closed, so a dispatch that ends a backlog counts); the maximum over all of them.
    With ``key="agent"`` only agents of the same app are paired; with ``models``, a
    client is backlogged only while it waits for every one of them (the condition of
    the bound on a pool of several models). This is the quantity HMFS bounds by ``2U``.

    Examples:
        >>> from fairagents.metrics import RequestRecord, Charge, max_service_gap
        >>> from fairagents import Outcome
        >>> recs = [RequestRecord(i, a, "t", "m", 0.0, 10.0, 10.0, 11.0, 1, 1, Outcome.FINISHED)
        ...         for i, a in [("1", "x"), ("2", "y")]]
        >>> charges = [Charge(1.0, "x", "t", 5.0), Charge(2.0, "y", "t", 2.0)]
        >>> max_service_gap(recs, charges, {"x": 1.0, "y": 1.0})
        5.0
    """
    records = list(records)
    backlog = backlog_intervals(records, key, models)
    series: dict[str, tuple[list[float], list[float]]] = {}
    per_client: dict[str, list[tuple[float, float]]] = defaultdict(list)
    if key == "app":  # _client, inlined: a run has a charge per token
        for c in charges:
            per_client[c.app].append((c.time, c.amount))
    else:
        for c in charges:
            per_client[_client(c.app, c.agent, key)].append((c.time, c.amount))
    for client, events in per_client.items():
        events.sort(key=_first)  # by time only: charges of one instant keep their order
        series[client] = (list(map(_first, events)), list(itertools.accumulate(map(_second, events))))
    names = sorted(backlog if clients is None else set(clients) & set(backlog))
    worst = 0.0
    for x, y in itertools.combinations(names, 2):
        if key == "agent" and x.split("/", 1)[0] != y.split("/", 1)[0]:
            continue
        for start, end in _intersect(backlog[x], backlog[y]):
            spread = _spread(series.get(x, _NO_SERVICE), weights[x], series.get(y, _NO_SERVICE), weights[y], start, end)
            worst = max(worst, spread)
    return worst


def client_stats(
    records: Sequence[RequestRecord],
    charges: Iterable[Charge],
    weights: Mapping[str, float],
    key: str = "app",
    until: float | None = None,
    rejected: Mapping[str, int] | None = None,
) -> list[ClientSnapshot]:
    """Per-app (or per-agent, named ``app/agent``) totals and percentiles of a run.

    ``weights`` names the clients to list; an agent's ``weight_share`` is its share of
    its own app. With ``until``, service counts only what was delivered up to then
    (say, while traffic arrived), so shares show who got the pool under contention.
    ``rejected`` gives each client's refused arrivals, if they were counted.

    Examples:
        >>> from fairagents.metrics import RequestRecord, Charge, client_stats
        >>> from fairagents import Outcome
        >>> recs = [RequestRecord("1", "x", "t", "m", 0.0, 0.1, 0.2, 1.0, 1, 2, Outcome.FINISHED)]
        >>> [s.share for s in client_stats(recs, [Charge(0.1, "x", "t", 4.0)], {"x": 1.0, "y": 1.0})]
        [1.0, 0.0]
    """
    service: dict[str, float] = defaultdict(float)
    for c in charges:
        if until is None or c.time <= until:
            service[_client(c.app, c.agent, key)] += c.amount
    by_client: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by_client[_client(r.app, r.agent, key)].append(r)
    total = sum(service.values()) or 1.0

    def group(name: str) -> str:
        return name.split("/", 1)[0] if key == "agent" else ""

    group_weight: dict[str, float] = defaultdict(float)
    for name, w in weights.items():
        group_weight[group(name)] += w
    out = []
    for name, weight in weights.items():
        recs = by_client.get(name, [])
        done = [r for r in recs if r.outcome is Outcome.FINISHED]
        waits = [r.queue_wait for r in recs if r.queue_wait is not None]
        ttfts = [r.ttft for r in done if r.ttft is not None]
        slo = [met for r in done if (met := r.slo_met()) is not None]
        out.append(
            ClientSnapshot(
                name=name,
                weight=weight,
                service=service.get(name, 0.0),
                share=service.get(name, 0.0) / total,
                weight_share=weight / group_weight[group(name)],
                done=len(done),
                failed=sum(r.outcome is Outcome.FAILED for r in recs),
                cancelled=sum(r.outcome is Outcome.CANCELLED for r in recs),
                rejected=0 if rejected is None else rejected.get(name, 0),
                wait_p50=percentile(waits, 50),
                wait_p99=percentile(waits, 99),
                ttft_p50=percentile(ttfts, 50),
                ttft_p99=percentile(ttfts, 99),
                e2e_p50=percentile([r.e2e for r in done], 50),
                slo_attainment=sum(slo) / len(slo) if slo else None,
            )
        )
    return out


def _client(app: str, agent: str, key: str) -> str:
    if key == "app":
        return app
    if key == "agent":
        return f"{app}/{agent}"
    raise ValueError(f"key must be 'app' or 'agent', got {key!r}")


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    intervals = sorted(intervals)
    out: list[tuple[float, float]] = []
    for start, end in intervals:
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _intersect(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        start, end = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if start < end:
            out.append((start, end))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


_NO_SERVICE: tuple[list[float], list[float]] = ([], [])
_first, _second = itemgetter(0), itemgetter(1)


def _spread(
    x: tuple[list[float], list[float]], wx: float, y: tuple[list[float], list[float]], wy: float, start: float,
    end: float,
) -> float:
    """Max minus min, over ``[start, end]``, of ``S_x(t)/w_x − S_y(t)/w_y`` (``S``: cumulative service).

    Taken just before ``start`` and at ``start``, ``end`` and every charge between (where
    the difference changes). ``x`` and ``y`` are ``(times, cumulative)``, times sorted.
    """
    (tx, cx), (ty, cy) = x, y
    # The charges within [start, end] are tx[lx:hx]; every service count inside is found in that range.
    lx, hx = bisect.bisect_left(tx, start), bisect.bisect_right(tx, end)
    ly, hy = bisect.bisect_left(ty, start), bisect.bisect_right(ty, end)
    points = {start, end}
    points.update(tx[lx:hx])
    points.update(ty[ly:hy])
    lo = hi = (cx[lx - 1] if lx else 0.0) / wx - (cy[ly - 1] if ly else 0.0) / wy  # before start
    right = bisect.bisect_right
    for t in sorted(points):
        i, j = right(tx, t, lx, hx), right(ty, t, ly, hy)  # charges at t included
        diff = (cx[i - 1] if i else 0.0) / wx - (cy[j - 1] if j else 0.0) / wy
        if diff < lo:
            lo = diff
        elif diff > hi:
            hi = diff
    return hi - lo
