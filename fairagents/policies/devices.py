"""Devices: which models of a pool share a capacity, and the policy's counters of each.

A **device** is a capacity that engines share: one GPU, the CPU of the embedded pool, a
set of remote replicas. Unified tokens make the service of different models comparable;
they do not make separate hardware one resource. So each device has its own seat of the
policy (:class:`~fairagents.policies.pooled.PoolPolicy`), with its own counters:

- **the engines of one device take one order**: their service counts in one set of
  counters, and an engine holds back a client that is ahead while a client that is
  behind waits on another engine of the device
  (:meth:`~fairagents.policies.pooled.PoolPolicy.holds`);
- **separate devices keep separate shares**: an app's use of a device nobody else wants
  never costs it on a device others contend for.

By default the in-process models of an arbiter share one device, :data:`LOCAL` (their
engines run on this machine's accelerator or CPU, and vLLM's engines of one process step
one at a time), and each remote model (replicas of its own) is a device of its own.
``Arbiter.add_model(..., device=...)`` and a model's ``device`` in the server's
configuration say otherwise.

:class:`Devices` is that map, and the policy of the pool as the dispatcher sees it: each
call goes to the policy of its model's device.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.policies.devices import Devices
    >>> devices = Devices(lambda: fa.policies.make_policy("hmfs"))
    >>> devices.assign("chat", "gpu0"), devices.assign("image", "gpu0"), devices.assign("remote", "remote")
    ('gpu0', 'gpu0', 'remote')
    >>> devices.seat("chat") is devices.seat("image"), devices.seat("chat") is devices.seat("remote")
    (True, False)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fairagents.cost import UnifiedTokenCost
from fairagents.errors import InvalidParameterError
from fairagents.policies import Policy
from fairagents.policies.pooled import LOCAL, PoolPolicy
from fairagents.policies.watched_lock import WatchedLock
from fairagents.request import Outcome, Request

__all__ = ["Devices", "LOCAL", "policy_factory"]

def policy_factory(policy: str | Policy, made: Policy, cost: UnifiedTokenCost) -> Callable[[], Policy]:
    """How to make the policy of each further device: by its name again, or as a copy of ``made`` before its first use.

    ``made`` is the policy of the first device (built from ``policy``); the copies price
    with the pool's ``cost`` model, as it does.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.policies.devices import policy_factory
        >>> cost = fa.UnifiedTokenCost()
        >>> policy = fa.policies.HMFS(cost)
        >>> again = policy_factory(policy, policy, cost)()
        >>> type(again).__name__, again is policy, again.cost is cost
        ('HMFS', False, True)
    """
    from fairagents.policies import make_policy

    if isinstance(policy, str):
        return lambda: make_policy(policy, cost)
    try:
        pristine = copy.deepcopy(made, {id(cost): cost})
    except Exception as err:  # a policy object holding what cannot be copied (a lock, a connection)
        reason = f"{type(err).__name__}: {err}"

        def refuse() -> Policy:
            raise InvalidParameterError(
                f"policy {made.name!r} is an object that cannot be copied for a second device ({reason}): pass its "
                "name ('module:Class') instead, or give every model one device")
        return refuse
    return lambda: copy.deepcopy(pristine, {id(cost): cost})


class Devices:
    """The devices of a pool: each model's device, and each device's seat of the policy (see the module docs).

    Args:
        make: makes the policy of a device (:func:`policy_factory`).
        first: the seat of the first device a model is assigned to (default: a new one).
        cost: the pool's cost model, which prices each seat's service.
    """

    def __init__(self, make: Callable[[], Policy], first: PoolPolicy | None = None,
                 cost: UnifiedTokenCost | None = None) -> None:
        self._make = make
        self._first = first
        self._cost = cost
        self.lock = first.lock if first is not None else WatchedLock()
        """Held for every call into any device's policy: one lock for the pool, which the dispatcher holds too."""
        self.seats: dict[str, PoolPolicy] = {}
        """Each device's seat of the policy, by device name, in the order the devices came."""
        self.device_of: dict[str, str] = {}
        """Each model's device."""
        self._policy_of: dict[str, Policy] = {}

    # -- the map -----------------------------------------------------------------------

    def assign(self, model: str, device: str) -> str:
        """Put ``model`` on ``device`` (made on first use); returns the device."""
        seat = self.seat_on(device, model)
        self.device_of[model] = device
        self._policy_of[model] = seat.policy
        return device

    def seat_on(self, device: str, model: str | None = None) -> PoolPolicy:
        """The seat of ``device``'s policy, made on first use."""
        if not isinstance(device, str) or not device:
            raise InvalidParameterError(f"a device is a non-empty string, got {device!r}", model=model)
        seat = self.seats.get(device)
        if seat is None:
            if not self.seats and self._first is not None:
                seat = self._first
                seat.device = device
            else:
                first = self._first
                seat = PoolPolicy(self._make(), self._cost if first is None else first.cost, device=device,
                                  lock=self.lock, clock=time.monotonic if first is None else first.clock)
            self.seats[device] = seat
        return seat

    def unassign(self, model: str) -> None:
        """``model`` left the pool (its device stays, with its counters)."""
        self.device_of.pop(model, None)
        self._policy_of.pop(model, None)

    def seat(self, model: str) -> PoolPolicy:
        """The seat of ``model``'s device."""
        return self.seats[self.device_of[model]]

    def policy_of(self, model: str) -> Policy:
        """The policy of ``model``'s device."""
        return self._policy_of[model]

    @property
    def primary(self) -> PoolPolicy | None:
        """The seat of the first device (the arbiter's :attr:`~fairagents.Arbiter.policy` is its policy)."""
        return next(iter(self.seats.values()), self._first)

    def __iter__(self) -> Iterator[PoolPolicy]:
        return iter(list(self.seats.values()))

    def holds(self, request: Request) -> bool:
        """Whether ``request`` waits for its device: a client owed more waits on another of its engines."""
        return self.seats[self.device_of[request.model]].holds(request.model, request.agent)

    # -- the policy, as the dispatcher sees it --------------------------------------------

    @property
    def name(self) -> str:
        """The policy's name (every device's policy is made alike)."""
        primary = self.primary
        return "none" if primary is None else primary.policy.name

    @property
    def cost(self) -> Any:
        """The cost model of the first device's policy (the arbiter registers each model's profile in it)."""
        primary = self.primary
        return None if primary is None else getattr(primary.policy, "cost", None)

    def on_arrival(self, req: Request, now: float) -> None:
        """Queue ``req`` in its device's policy."""
        self._policy_of[req.model].on_arrival(req, now)

    def select(self, model: str, now: float) -> Request | None:
        """The request ``model`` runs next, by its device's policy."""
        return self._policy_of[model].select(model, now)

    def select_among(self, models: Iterable[str], now: float) -> Request | None:
        """Each device's choice among its ``models``; of those, the one that arrived first (devices share no counters)."""
        by_device: dict[str, list[str]] = {}
        for model in models:
            by_device.setdefault(self.device_of[model], []).append(model)
        choices = [self.seats[device].policy.select_among(group, now) for device, group in by_device.items()]
        return min((c for c in choices if c is not None), key=lambda r: r.arrival, default=None)

    def on_dispatch(self, req: Request, now: float) -> None:
        """``req`` left the queue: its device's policy charges its input."""
        self._policy_of[req.model].on_dispatch(req, now)

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        """Charge ``req``'s output on its device."""
        self._policy_of[req.model].on_progress(req, new_output_tokens, now)

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        """``req`` ended, on its device."""
        self._policy_of[req.model].on_finish(req, outcome, now)

    def queued(self, model: str | None = None) -> int:
        """Requests waiting in the policies, for ``model`` or on every device."""
        if model is not None:
            policy = self._policy_of.get(model)
            return 0 if policy is None else policy.queued(model)
        return sum(seat.policy.queued() for seat in self)
