"""Several arbiters, one fair share: fairness counters shared through a store (Redis).

Users outgrow one front door: several ``fairagents serve`` processes sit in front of the
same remote replicas for availability. With counters kept per process, each door is
fair only among the requests it sees, and a door that sees one app serves it whenever
it has room: weights 4:1 become the doors' traffic ratio. Here every door keeps the
HMFS counters of the whole pool (:mod:`fairagents.policies.hmfs`) in one store and
draws on one capacity per shared model.

- **Counters**: charges are added as commuting increments (``HINCRBYFLOAT``), batched
  per door and sent every ``interval`` (20 ms by default); the lift (min over active
  clients, then raise) is one atomic step of the store (a Lua script in Redis).
- **Capacity**: for models every door sends to (remote replicas), a door dispatches
  the policy's choice only when the pool, all doors counted, has a slot and KV room,
  and no client waiting at another door has a lower counter
  (:meth:`SharedView.gate`).
- **Failure**: a door that cannot reach the store serves on its own counters and the
  capacity it sees itself, says so in its log, ``/health`` and ``/metrics``, retries
  with backoff, and reconciles when the store is back. A door that stops syncing for
  ``ttl`` stops counting for the others.

**The guarantee** becomes ``2(U + S)``, where ``S`` is the most counter growth a client
receives at the other doors in the ``2(Δ + ℓ)`` before a decision (``Δ`` the sync
interval, ``ℓ`` a sync's round trip; :func:`staleness_bound`); while the store
is unreachable each door is fair among its own requests only. See *Scaling out* in the
docs for the argument.
"""

from __future__ import annotations

from fairagents.shared.counters import SharedCounters
from fairagents.shared.redis import RedisStore
from fairagents.shared.store import SYNC_LUA, CounterStore, MemoryStore, StoreUnavailable
from fairagents.shared.view import SharedView

__all__ = [
    "CounterStore",
    "MemoryStore",
    "RedisStore",
    "SYNC_LUA",
    "SharedCounters",
    "SharedView",
    "StoreUnavailable",
    "staleness_bound",
]


def staleness_bound(doors: int, rate: float, interval: float, round_trip: float) -> float:
    """``S``: the most counter a client can gain at other doors unseen by one door's decision.

    Args:
        doors: ``A``, the arbiters sharing the counters.
        rate: ``r``, the most counter units one door charges one client per second
            (its engines' token throughput × ``w_output`` × the unified factor / weight).
        interval: ``Δ``, seconds between syncs.
        round_trip: ``ℓ``, seconds one sync takes.

    The gap between two backlogged clients stays within ``2 · (U + S)``.

    Examples:
        >>> from fairagents.shared import staleness_bound
        >>> staleness_bound(doors=2, rate=1000.0, interval=0.005, round_trip=0.001)
        12.0
        >>> staleness_bound(doors=1, rate=1000.0, interval=0.005, round_trip=0.001)
        0.0
    """
    return (doors - 1) * rate * 2 * (interval + round_trip)
