"""One arbiter's view of the fairness state it shares with the other arbiters of a pool.

Pure and synchronous, like the policies: the driver (:class:`~fairagents.shared.SharedCounters`
live, the simulator on a virtual clock) moves :meth:`SharedView.payload` to a store and
:meth:`SharedView.apply` back; in between, the dispatcher asks :meth:`SharedView.gate`
before each dispatch, and the policy takes its lift's floor from the view.

**What a door may dispatch.** For a model whose capacity the doors share (remote
replicas every door sends to), the policy's choice runs only when

- the door holds a free slot of its **lease**: the slots the store granted it at the
  last sync (see :mod:`fairagents.shared.store`). Leases never add up to more than
  the model's slots, so the doors together never hand the replicas more than their
  limit. While a sync is on its way, a door runs no more requests of the model than
  it reported in it (the store may shrink its lease to that and hand the rest to
  others);
- the KV tokens reserved at every door, as of the last sync, leave room for it (this
  one is optimistic: two doors may both spend the same free tokens within a sync);
- the door has the **turn** (its lowest-counter app is the lowest waiting anywhere, by
  the store's counters at the last sync), or it still has some of the slots it was
  granted without the turn (those no request waiting at a turn-holding door needs).

The door with the turn reuses the slots its requests free until its next sync; the
others do not, and the store hands their freed slots to whoever has the turn then. So
the turn is decided once per sync on the same counters for every door, and no slot
stays idle longer than about two sync intervals while a request waits for it. Within
a door, the policy orders its own requests (apps, then agents); an app's agents at
different doors are ordered by their shared counters only through the lift.
"""

from __future__ import annotations

import contextlib

from typing import TYPE_CHECKING, Any

from fairagents.errors import InvalidParameterError
from fairagents.policies.hmfs import HMFS
from fairagents.request import Request

if TYPE_CHECKING:
    from fairagents.dispatcher import Dispatcher
    from fairagents.records import ModelState, Ticket
    from fairagents.shared.store import Payload, Reply

__all__ = ["SharedView"]


class SharedView:
    """This arbiter's side of shared counters: deltas to send, the pool's state received.

    Args:
        door: this arbiter's name among the doors (unique per process and pool).
        policy: the arbiter's policy; shared counters are HMFS counters.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.shared import SharedView
        >>> SharedView("a", fa.policies.FCFS())
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: shared counters need the 'hmfs' policy (its counters are what is shared), not 'fcfs'
    """

    def __init__(self, door: str, policy: Any) -> None:
        if not isinstance(policy, HMFS):
            raise InvalidParameterError(
                f"shared counters need the 'hmfs' policy (its counters are what is shared), not {policy.name!r}")
        self.door = door
        self.policy = policy
        self.lock: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        """Held while a payload reads the policy or a reply sets its counters (the pool's policy lock, which
        in-engine schedulers take too)."""
        self.dispatcher: Dispatcher | None = None
        self.shared_models: frozenset[str] = frozenset()
        """Models whose capacity every door shares (remote replicas): dispatches into them are gated."""
        self.connected = False
        """Whether the last sync reached the store (else this door decides on its own counters)."""
        self.doors = 1
        """Live doors in the last sync, this one included."""
        self._seq = 0
        self._inflight: tuple[int, dict[str, float], dict[str, dict[str, float]]] | None = None  # sent, not acknowledged
        self._apps: dict[str, float] = {}  # counter deltas not yet sent
        self._agents: dict[str, dict[str, float]] = {}
        self._alone_apps: dict[str, float] = {}  # charged while the store was unreachable: never sent
        self._alone_agents: dict[str, dict[str, float]] = {}
        self._elsewhere: dict[str, tuple[int, int]] = {}  # model -> (requests, KV tokens) running at other doors
        self._lease: dict[str, int] = {}
        self._turn: dict[str, bool] = {}
        self._granted: dict[str, int] = {}  # without the turn: requests it may still start until the next sync
        # While a payload is on its way, the door runs no more than it reported: the store may shrink
        # its lease to that, and the others may already be given the rest.
        self._frozen: dict[str, int] = {}
        self._reported: dict[str, int] = {}  # requests running per shared model, as the last payload said
        self._app_floor: float | None = None
        self._app_left: float | None = None
        self._agent_floor: dict[str, float] = {}
        self._agent_left: dict[str, float] = {}
        policy.share_floors(self._floor_of_apps, self._floor_of_agents)

    def bind(self, dispatcher: Dispatcher, shared_models: frozenset[str] | set[str]) -> None:
        """Serve through ``dispatcher``; gate dispatches into ``shared_models``."""
        self.dispatcher = dispatcher
        self.shared_models = frozenset(shared_models)

    # -- what the dispatcher and the policy ask -------------------------------------------------

    def charge(self, request: Request, amount: float) -> None:
        """Record a charge the policy just made (the dispatcher's charge callback), to be sent.

        A charge made while the store is unreachable is this door's alone: it orders
        this door's requests meanwhile and is dropped when the door rejoins the pool
        (see :meth:`apply`).
        """
        d_app, d_agent = self.policy.growth(request.agent, amount)
        app = request.app
        apps, agents = (self._apps, self._agents) if self.connected else (self._alone_apps, self._alone_agents)
        apps[app] = apps.get(app, 0.0) + d_app
        of_app = agents.get(app)
        if of_app is None:
            of_app = agents[app] = {}
        of_app[request.agent.name] = of_app.get(request.agent.name, 0.0) + d_agent

    def gate(self, ticket: Ticket, m: ModelState) -> bool:
        """Whether the policy's choice for ``m`` may run now, by the pool's view (module docstring)."""
        name = m.name
        if name not in self.shared_models:
            return True
        lease = self._lease.get(name)
        if lease is None:  # no sync reached the store: this door's own limits only
            return True
        frozen = self._frozen.get(name)
        if m.running >= (lease if frozen is None else min(lease, frozen)):
            return False
        running, reserved = self._elsewhere.get(name, (0, 0))
        budget = m.token_budget if m.budget_limit is None else m.budget_limit
        if budget is not None and running + m.running and reserved + m.reserved + ticket.reserved > budget:
            return False
        if not self._turn.get(name, True):  # not this door's turn: only the slots it was granted
            granted = self._granted.get(name, 0)
            if granted <= 0:
                return False
            self._granted[name] = granted - 1
        return True

    def _floor_of_apps(self, active: float | None, left: float | None) -> float:
        return _floor(active, self._app_floor, left, self._app_left)

    def _floor_of_agents(self, app: str, active: float | None, left: float | None) -> float:
        return _floor(active, self._agent_floor.get(app), left, self._agent_left.get(app))

    # -- the sync ---------------------------------------------------------------------------------

    def payload(self, *, ttl: int, reconcile: bool = False) -> Payload:
        """What to send now: the charges not yet acknowledged, what waits and runs here.

        Charges go out once: a payload whose reply never came is sent again with the
        same ``seq`` and the same deltas (the store adds them only if it had not), and
        charges made since wait for the next one. ``reconcile`` adds this door's whole
        view of its clients' counters, to be raised to (after the store was unreachable:
        it may have lost them).
        """
        with self.lock:
            return self._payload(ttl=ttl, reconcile=reconcile)

    def _payload(self, *, ttl: int, reconcile: bool) -> Payload:
        if self._inflight is None:
            self._seq += 1
            self._inflight = (self._seq, self._apps, self._agents)
            self._apps, self._agents = {}, {}
        seq, apps, agents = self._inflight
        running = {} if self.dispatcher is None else {
            m.name: [m.running, m.reserved] for m in self.dispatcher.models.values() if m.running}
        self._frozen = self._reported = {name: running.get(name, (0, 0))[0] for name in self.shared_models}
        waiting = self.policy.waiting_by_client()
        want = self._wanted(waiting, apps, agents) if not reconcile else self.policy.clients()
        limits = {} if self.dispatcher is None else {
            name: m.slots for name, m in self.dispatcher.models.items() if name in self.shared_models}
        payload: Payload = {"door": self.door, "seq": seq, "ttl": int(ttl), "apps": apps, "agents": agents,
                            "waiting": waiting, "running": running, "limits": limits, "want": want}
        if reconcile:  # this door's view, without what it charged alone
            alone_apps, alone_agents = self._alone_apps, self._alone_agents
            payload["raise"] = {
                "apps": {a: c - alone_apps.get(a, 0.0) for a, c in self.policy.app_counters().items()},
                "agents": {app: {g: c - alone_agents.get(app, {}).get(g, 0.0)
                                 for g, c in self.policy.agent_counters(app).items()} for app in want},
            }
        return payload

    def _wanted(self, waiting: dict[str, dict[str, dict[str, int]]], apps: dict[str, float],
                agents: dict[str, dict[str, float]]) -> dict[str, list[str]]:
        """The clients whose counters this door needs back: those waiting or running here, or charged.

        A sync then costs what is active, not every client ever seen; a client that
        becomes active again is lifted here and set to the pool's value at the next sync.
        """
        want: dict[str, set[str]] = {}
        for of_model in waiting.values():
            for app, of_app in of_model.items():
                want.setdefault(app, set()).update(of_app)
        for source in (agents, self._agents):
            for app, of_app in source.items():
                want.setdefault(app, set()).update(of_app)
        for app in (*apps, *self._apps):
            want.setdefault(app, set())
        if self.dispatcher is not None:
            for ticket in self.dispatcher.tickets():
                want.setdefault(ticket.request.app, set()).add(ticket.request.agent.name)
        return {app: sorted(names) for app, names in want.items()}

    def apply(self, reply: Reply) -> None:
        """Take the pool's state: this door's counters become the pool's, plus its charges not yet sent.

        Set, not raised: a counter this door lifted on its own since the last sync (a
        client that became active here) goes back to the pool's value, which the store
        lifted itself if the client was new to the pool. So after every sync this door
        orders its clients on exactly the counters the store grants leases by; a door
        that kept a higher counter of its own could refuse a turn the store gives it,
        while the store gives the slots to nobody else.

        Charges made while the store was unreachable are dropped here too: while apart,
        each door was fair among its own requests only, and counting that service would
        make an app that got more than its share wait, after the store is back, until
        the others caught up — for longer than the outage lasted.
        """
        with self.lock:
            self._apply(reply)

    def _apply(self, reply: Reply) -> None:
        self._inflight = None
        self._frozen = {}
        self._alone_apps, self._alone_agents = {}, {}
        pending_apps, pending_agents = self._apps, self._agents
        for app, counter in reply["apps"].items():
            pending = pending_agents.get(app, {})
            agents = {a: c + pending.get(a, 0.0) for a, c in reply["agents"].get(app, {}).items()}
            self.policy.set_counters(app, counter + pending_apps.get(app, 0.0), agents)
        self._elsewhere = {model: (int(n), int(tokens)) for model, (n, tokens) in reply["others"].items()}
        self._lease = {m: int(n) for m, n in (reply.get("lease") or {}).items()}
        self._turn = {m: bool(t) for m, t in (reply.get("turn") or {}).items()}
        self._granted = {m: n - self._reported.get(m, 0) for m, n in self._lease.items()}
        floor = reply["floor"]
        self._app_floor = floor.get("apps")
        self._app_left = floor.get("apps_left")
        self._agent_floor = dict(floor.get("agents") or {})
        self._agent_left = dict(floor.get("agents_left") or {})
        self.doors = int(reply["doors"])
        self.connected = True

    def disconnected(self) -> None:
        """The store is unreachable: decide on this door's own state until it is back."""
        self._elsewhere = {}
        self._lease = {}
        self._turn = {}
        self._granted = {}
        self._frozen = {}
        self._app_floor = self._app_left = None
        self._agent_floor, self._agent_left = {}, {}
        self.connected = False
        self.doors = 1

    def leases(self) -> dict[str, dict[str, Any]]:
        """Per shared model: the slots this door holds, whether it has the turn, what runs elsewhere (last sync)."""
        return {m: {"slots": n, "turn": self._turn.get(m, True), "elsewhere": self._elsewhere.get(m, (0, 0))[0]}
                for m, n in self._lease.items()}


def _floor(active: float | None, outside: float | None, left: float | None, outside_left: float | None) -> float:
    """The lift's floor: the lowest active counter anywhere, else the highest of those that left last."""
    if active is not None or outside is not None:
        return min(x for x in (active, outside) if x is not None)
    lefts = [x for x in (left, outside_left) if x is not None]
    return max(lefts) if lefts else 0.0
