"""ExFairS (Huang et al., "Experiential Fairness", AAAI'26): equity of outcome, not of resources.

Each client (an app, or an agent with ``client="agent"``) has an **SLO-Aware Fairness
Index**, ``SAFI = α · SLO + (1 − α) · Usage`` (eq. 4): its share of requests that
missed their SLO, and its service (``input + 2·output`` tokens) relative to the most
served client. Higher is worse. Every ``period`` the clients are paired from both ends
of the SAFI order; while a pair's gap is at least ``β``, the worse client buys ``R``
units of resource from the better one with credits (Algorithm 1; ``exchange`` picks the
formula for ``R``, ``pairs`` which pairs trade). A client's priority is ``−resource``.
An arriving request moves up its model's queue past a share of the lower-priority
requests, proportional to its rank, times ``multiplier``, at most ``max_forward``
positions (Algorithm 2); the queue is then served in order. The period's work runs at
the first event at or after its end: a policy has no timer.

See the policies page in the docs (*Choosing a policy*, ExFairS) for the parameters,
the starvation bound, and where the paper is ambiguous and what was chosen.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import ClassVar, Literal

from fairagents.cost import CostModel, RawTokenCost
from fairagents.errors import InvalidParameterError, ProtocolError
from fairagents.policies.base import BasePolicy
from fairagents.request import Outcome, Request

__all__ = [
    "EXCHANGE_RULES",
    "ExFairS",
    "credit_exchange",
    "exchange_alg1",
    "exchange_code",
    "exchange_eq6",
    "insert_position",
]

#: Slack for floating-point error in SAFI gaps (floors and the ``β`` threshold).
_EPS = 1e-9


def exchange_eq6(gap: float) -> int:
    """``R = ⌊(SAFI_H − SAFI_L) / 2 × 10⌋`` (eq. 6); the default exchange amount.

    Examples:
        >>> from fairagents.policies.exfairs import exchange_eq6
        >>> exchange_eq6(0.7), exchange_eq6(0.3), exchange_eq6(0.15)
        (3, 1, 0)
    """
    return math.floor(gap * 5 + _EPS)


def exchange_alg1(gap: float) -> int:
    """``R = round(Δ × 5)`` (Algorithm 1, line 9), rounding halves up.

    Examples:
        >>> from fairagents.policies.exfairs import exchange_alg1
        >>> exchange_alg1(0.7), exchange_alg1(0.3), exchange_alg1(0.1)
        (4, 2, 1)
    """
    return math.floor(gap * 5 + 0.5 + _EPS)


def exchange_code(gap: float) -> int:
    """``R = int(min(Δ, 0.5) × 10)``: the amount in the authors' code (sensitivity 1, cap 0.5).

    Examples:
        >>> from fairagents.policies.exfairs import exchange_code
        >>> exchange_code(0.7), exchange_code(0.3), exchange_code(0.15)
        (5, 3, 1)
    """
    return math.floor(min(gap, 0.5) * 10 + _EPS)


#: The exchange amounts by name: ``eq6`` (default), ``alg1``, ``code``.
EXCHANGE_RULES: dict[str, Callable[[float], int]] = {
    "eq6": exchange_eq6,
    "alg1": exchange_alg1,
    "code": exchange_code,
}


def credit_exchange(
    safi: Mapping[Hashable, float],
    credit: Mapping[Hashable, float],
    *,
    beta: float = 0.1,
    amount: Callable[[float], int] = exchange_eq6,
    pairs: Literal["all", "extremes"] = "all",
) -> list[tuple[Hashable, Hashable, int]]:
    """Algorithm 1: which clients trade, and how much; ``(H, L, R)`` for each pair.

    Clients are sorted by SAFI, then credit, both descending (line 1; then by name), and
    paired from both ends inwards (``H`` the head, ``L`` the tail) while the pair's SAFI
    gap is at least ``beta`` (lines 4–18). ``H`` then spends ``R = amount(gap)`` credits for
    ``R`` units of resource, which ``L`` gives up for ``R`` credits (lines 10–13); the
    caller applies that. A pair with ``R = 0`` is listed (it traded nothing).
    ``pairs="extremes"`` stops after the first pair (the paper's text).

    Examples:
        >>> from fairagents.policies.exfairs import credit_exchange, exchange_alg1
        >>> safi = {"a": 0.7, "b": 0.6, "c": 0.3, "d": 0.0}
        >>> credit_exchange(safi, {})                          # a↔d gap 0.7, b↔c gap 0.3 (eq. 6)
        [('a', 'd', 3), ('b', 'c', 1)]
        >>> credit_exchange(safi, {}, amount=exchange_alg1)    # Algorithm 1's rounding
        [('a', 'd', 4), ('b', 'c', 2)]
        >>> credit_exchange({"a": 0.9, "b": 0.5, "c": 0.45, "d": 0.1}, {})   # b↔c: 0.05 < β, stop
        [('a', 'd', 4)]
    """
    order = sorted(safi, key=lambda c: (-safi[c], -credit.get(c, 0), str(c)))
    out: list[tuple[Hashable, Hashable, int]] = []
    head, tail = 0, len(order) - 1
    while head < tail:
        high, low = order[head], order[tail]
        gap = safi[high] - safi[low]
        if gap < beta - _EPS:
            break
        out.append((high, low, amount(gap)))
        if pairs == "extremes":
            break
        head, tail = head + 1, tail - 1
    return out


def insert_position(
    queue_length: int, cache: Mapping[int, int], priority: int, *, multiplier: int = 2, max_forward: int = 50
) -> int:
    """Algorithm 2: where a request of ``priority`` enters a queue (0 is the head).

    ``cache`` maps each priority to how many requests of it wait in the queue (a smaller
    value is a higher priority). With ``N_h`` the distinct queued priorities higher than
    ``priority``, ``N_total`` the distinct priorities counting ``priority`` itself, and
    ``N_o`` the queued requests of lower priority, the request moves forward
    ``P_f = min(⌊N_o·(1 − N_h/N_total)⌋·M, P_max, N_o, |Q|)`` positions from the tail
    (lines 4–19); into an empty queue, at the tail (lines 1–2).

    Examples:
        >>> from fairagents.policies.exfairs import insert_position
        >>> cache = {0: 2, 1: 3, 3: 5}                   # 10 waiting
        >>> insert_position(10, cache, 2)                # N_h=2, N_total=4, N_o=5: ⌊2.5⌋·2 = 4 forward
        6
        >>> insert_position(10, cache, -1)               # the highest: past all 10 lower ones
        0
        >>> insert_position(10, cache, 3), insert_position(10, cache, 7)   # nothing lower: the tail
        (10, 10)
        >>> insert_position(200, {0: 200}, -5)           # capped at P_max = 50
        150
    """
    if not any(cache.values()):
        return queue_length
    unique = [p for p, n in cache.items() if n > 0]
    n_higher = sum(1 for p in unique if p < priority)
    n_total = len(unique) + (0 if priority in unique else 1)
    n_lower = sum(n for p, n in cache.items() if p > priority)
    forward = 0
    if n_lower > 0:
        base = n_lower * (n_total - n_higher) // n_total  # ⌊N_o · (1 − r)⌋, exactly
        forward = min(base * multiplier, max_forward, n_lower, queue_length)
    return max(0, queue_length - forward)


class _Live:
    """What the policy keeps of a request until it finishes."""

    __slots__ = ("client", "first_token", "judged", "output", "priority")

    def __init__(self, client: Hashable, priority: int) -> None:
        self.client = client
        self.priority = priority
        self.first_token: float | None = None
        self.output = 0
        self.judged = False


class ExFairS(BasePolicy):
    """ExFairS: SAFI per client (eq. 4), credit exchange each period (Alg. 1), proportional insertion (Alg. 2).

    Args:
        cost: how service is counted (eq. 1); raw tokens, input 1 and output 2, by
            default. A :class:`~fairagents.UnifiedTokenCost` counts unified tokens.
        client: ``"app"`` (default) or ``"agent"``: whose SAFI, credit and resource.
        alpha: ``α`` of eq. 4, the weight of the SLO violation rate (0.7 in the paper).
        beta: ``β``, the SAFI gap at which two clients trade (0.1 in the paper).
        multiplier: ``M`` of Algorithm 2 (2).
        max_forward: ``P_max`` of Algorithm 2, the most positions a request moves up (50).
        period: seconds between exchanges (the paper gives none; 60, the round length in
            the authors' configuration). Shorten it when SLOs are of a few seconds or less.
        exchange: ``R`` as a function of the SAFI gap, or its name in
            :data:`EXCHANGE_RULES` (``"eq6"``, the default; ``"alg1"``; ``"code"``).
        pairs: ``"all"`` (Algorithm 1) or ``"extremes"`` (only the worst and best client).
        count_overdue: judge a request as a violation at a period's end once its deadline
            has passed, before it finishes (see the policies page in the docs).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.policies.exfairs import ExFairS
        >>> slow = fa.Agent("t", fa.App("slow", slo=fa.SLO(e2e=1.0)))
        >>> fast = fa.Agent("t", fa.App("fast", slo=fa.SLO(e2e=100.0)))
        >>> policy = ExFairS(period=10.0)
        >>> def run(i, who, now, took):   # one request: dispatched at once, 5 tokens out, finished after `took`
        ...     r = fa.Request(id=i, agent=who, model="m", prompt_tokens=10, max_tokens=5, arrival=now)
        ...     policy.on_arrival(r, now); policy.on_dispatch(r, now)
        ...     policy.on_progress(r, 5, now + took); policy.on_finish(r, fa.Outcome.FINISHED, now + took)
        >>> run("s1", slow, 0.0, 3.0); run("f1", fast, 0.0, 3.0)   # equal service; only "slow" misses its SLO
        >>> for i in range(4):   # the next period: "fast" queues four requests ...
        ...     policy.on_arrival(fa.Request(id=f"f{i + 2}", agent=fast, model="m", prompt_tokens=10,
        ...                                  max_tokens=5, arrival=10.0), now=10.0)
        >>> {c: round(v, 3) for c, v in policy.safi().items()}   # over the first period, at its end
        {'slow': 1.0, 'fast': 0.3}
        >>> policy.exchanges()   # Δ = 0.7: R = ⌊0.7/2 × 10⌋ = 3 (eq. 6)
        [('slow', 'fast', 3)]
        >>> policy.on_arrival(fa.Request(id="s2", agent=slow, model="m", prompt_tokens=10,
        ...                              max_tokens=5, arrival=10.5), now=10.5)
        >>> [r.id for r in policy.queue("m")]   # ... and "slow" (priority −3) is inserted ahead of them
        ['s2', 'f2', 'f3', 'f4', 'f5']
    """

    name: ClassVar[str] = "exfairs"
    reads_slos: ClassVar[bool] = True

    def __init__(
        self,
        cost: CostModel | None = None,
        *,
        client: Literal["app", "agent"] = "app",
        alpha: float = 0.7,
        beta: float = 0.1,
        multiplier: int = 2,
        max_forward: int = 50,
        period: float = 60.0,
        exchange: str | Callable[[float], int] = "eq6",
        pairs: Literal["all", "extremes"] = "all",
        count_overdue: bool = True,
    ) -> None:
        if client not in ("app", "agent"):
            raise InvalidParameterError(f"ExFairS client must be 'app' or 'agent', got {client!r}")
        if not (isinstance(alpha, int | float) and 0.0 <= alpha <= 1.0):
            raise InvalidParameterError(f"ExFairS alpha must be in [0, 1], got {alpha!r}")
        if not (isinstance(beta, int | float) and math.isfinite(beta) and beta >= 0):
            raise InvalidParameterError(f"ExFairS beta must be a finite number ≥ 0, got {beta!r}")
        for what, value in (("multiplier", multiplier), ("max_forward", max_forward)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidParameterError(f"ExFairS {what} must be an integer ≥ 0, got {value!r}")
        if not (isinstance(period, int | float) and math.isfinite(period) and period > 0):
            raise InvalidParameterError(f"ExFairS period must be a finite number of seconds > 0, got {period!r}")
        if isinstance(exchange, str):
            try:
                exchange = EXCHANGE_RULES[exchange]
            except KeyError:
                raise InvalidParameterError(
                    f"unknown ExFairS exchange {exchange!r}; choose from {', '.join(EXCHANGE_RULES)} or pass a function"
                ) from None
        elif not callable(exchange):
            raise InvalidParameterError(f"ExFairS exchange must be a name or a function, got {exchange!r}")
        if pairs not in ("all", "extremes"):
            raise InvalidParameterError(f"ExFairS pairs must be 'all' or 'extremes', got {pairs!r}")
        super().__init__(cost if cost is not None else RawTokenCost())
        self.client = client
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.multiplier = multiplier
        self.max_forward = max_forward
        self.period = float(period)
        self.exchange = exchange
        self.pairs = pairs
        self.count_overdue = count_overdue
        # Per model: the queue (Algorithm 2's Q) and the priorities waiting in it (its cache C).
        self._queues: dict[str, deque[Request]] = {}
        self._caches: dict[str, dict[int, int]] = {}
        self._live: dict[str, _Live] = {}
        # Per client, for good: Algorithm 1's credit and resource.
        self._credit: dict[Hashable, int] = {}
        self._resource: dict[Hashable, int] = {}
        # Per client, over the current period: service, requests judged, and violations among them.
        self._served: dict[Hashable, float] = {}
        self._judged: dict[Hashable, int] = {}
        self._violated: dict[Hashable, int] = {}
        self._period_end: float | None = None
        self._safi: dict[Hashable, float] = {}
        self._exchanges: list[tuple[Hashable, Hashable, int]] = []

    # -- what it knows ------------------------------------------------------

    def safi(self) -> dict[Hashable, float]:
        """SAFI of each client active in the last period that ended (eq. 4), worst first."""
        return dict(sorted(self._safi.items(), key=lambda kv: (-kv[1], str(kv[0]))))

    def exchanges(self) -> list[tuple[Hashable, Hashable, int]]:
        """The trades of the last period that ended: ``(H, L, R)``, ``H`` buying ``R`` from ``L``."""
        return list(self._exchanges)

    def credits(self) -> dict[Hashable, int]:
        """Credit of each client that has traded (Algorithm 1; 0 before its first trade)."""
        return dict(self._credit)

    def resources(self) -> dict[Hashable, int]:
        """Resource of each client that has traded (Algorithm 1); its priority is ``−resource``."""
        return dict(self._resource)

    def priority(self, client: Hashable) -> int:
        """The priority a request of ``client`` gets if it arrives now: ``−resource`` (smaller first)."""
        return -self._resource.get(client, 0)

    def queue(self, model: str) -> list[Request]:
        """The requests waiting for ``model``, in the order they will be dispatched."""
        return list(self._queues.get(model, ()))

    # -- driver-facing ------------------------------------------------------

    def select(self, model: str, now: float) -> Request | None:
        queue = self._queues.get(model)
        return queue[0] if queue else None

    def on_dispatch(self, req: Request, now: float) -> None:
        """Move ``req`` from the queue to running and charge its input (after closing a period that ended)."""
        self._tick(now)
        super().on_dispatch(req, now)

    def on_take(self, req: Request, now: float) -> None:
        """Move ``req`` from the queue to running, its input charged later (after closing a period that ended)."""
        self._tick(now)
        super().on_take(req, now)

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        """Charge the new output; the first call with tokens marks the first token."""
        end = self._period_end
        if end is not None and now >= end:
            self._tick(now)
        # BasePolicy.on_progress with _charge inlined: this runs for every streamed chunk.
        if req.id not in self._running:
            raise ProtocolError(f"request {req.id!r} is not running")
        if new_output_tokens:  # the cost model rejects a negative or non-integer count
            amount = self._output_cost(req.model, new_output_tokens)
            live = self._live[req.id]
            served = self._served
            served[live.client] = served.get(live.client, 0.0) + amount
            if live.first_token is None:
                live.first_token = now
            live.output += new_output_tokens

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        """Forget ``req``, judging it against its SLO first (eq. 3)."""
        self._tick(now)
        super().on_finish(req, outcome, now)
        live = self._live.pop(req.id)
        if live.judged or outcome is Outcome.CANCELLED:
            return
        slo = req.agent.effective_slo
        if slo is None:
            return
        if outcome is Outcome.FAILED:
            met = False
        else:
            first = live.first_token if live.first_token is not None else now
            tpot = (now - first) / (live.output - 1) if live.output >= 2 else None
            met = slo.met(ttft=first - req.arrival, tpot=tpot, e2e=now - req.arrival)
        self._judge(live.client, violated=not met)

    # -- subclass hooks -----------------------------------------------------

    def _client(self, req: Request) -> Hashable:
        return req.agent.app.name if self.client == "app" else req.agent.key

    def _enqueue(self, req: Request, now: float) -> None:
        self._tick(now)
        client = self._client(req)
        priority = -self._resource.get(client, 0)
        self._live[req.id] = _Live(client, priority)
        queue = self._queues.get(req.model)
        if queue is None:
            queue = self._queues[req.model] = deque()
            self._caches[req.model] = {}
        cache = self._caches[req.model]
        at = insert_position(len(queue), cache, priority, multiplier=self.multiplier, max_forward=self.max_forward)
        if at == len(queue):
            queue.append(req)
        else:
            queue.insert(at, req)
        cache[priority] = cache.get(priority, 0) + 1  # line 22

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        queue = self._queues[req.model]
        if queue[0] is req:
            queue.popleft()
        else:  # by identity: deque.remove would compare every request before it field by field
            del queue[next(i for i, queued in enumerate(queue) if queued is req)]
        cache = self._caches[req.model]
        priority = self._live[req.id].priority
        left = cache[priority] - 1
        if left:
            cache[priority] = left
        else:
            del cache[priority]

    def _charge(self, req: Request, amount: float, now: float) -> None:
        client = self._live[req.id].client
        self._served[client] = self._served.get(client, 0.0) + amount

    # -- the period ---------------------------------------------------------

    def _judge(self, client: Hashable, *, violated: bool) -> None:
        self._judged[client] = self._judged.get(client, 0) + 1
        if violated:
            self._violated[client] = self._violated.get(client, 0) + 1

    def _tick(self, now: float) -> None:
        """Close the period if ``now`` has reached its end; start the first one at the first event."""
        end = self._period_end
        if end is None:
            self._period_end = now + self.period
        elif now >= end:
            self._close_period(end)
            self._period_end = end + self.period * (math.floor((now - end) / self.period) + 1)

    def _close_period(self, end: float) -> None:
        """SAFI of the active clients over the period ending at ``end`` (eqs. 1–4), then Algorithm 1."""
        active = set(self._served) | set(self._judged)
        for reqs in (self._waiting, self._running):
            for rid, req in reqs.items():
                live = self._live.get(rid)
                if live is None:  # the arrival that closes the period: it belongs to the next one
                    continue
                active.add(live.client)
                if self.count_overdue and not live.judged:
                    slo = req.agent.effective_slo
                    if slo is None:
                        continue
                    age = end - req.arrival
                    late = (slo.e2e is not None and age > slo.e2e) or (
                        slo.ttft is not None and live.first_token is None and age > slo.ttft
                    )
                    if late:
                        live.judged = True
                        self._judge(live.client, violated=True)
        most = max(self._served.values(), default=0.0)
        safi = {}
        for c in active:
            judged = self._judged.get(c, 0)
            slo_rate = self._violated.get(c, 0) / judged if judged else 0.0  # eq. 3
            usage = self._served.get(c, 0.0) / most if most > 0 else 0.0  # eq. 2
            safi[c] = self.alpha * slo_rate + (1 - self.alpha) * usage  # eq. 4
        self._exchanges = credit_exchange(safi, self._credit, beta=self.beta, amount=self.exchange, pairs=self.pairs)
        for high, low, r in self._exchanges:  # Algorithm 1, lines 10–13
            self._credit[high] = self._credit.get(high, 0) - r
            self._resource[high] = self._resource.get(high, 0) + r
            self._credit[low] = self._credit.get(low, 0) + r
            self._resource[low] = self._resource.get(low, 0) - r
        self._safi = safi
        self._served, self._judged, self._violated = {}, {}, {}
