"""One arbiter's view of the fairness state it shares with the other arbiters of a pool.

Pure and synchronous, like the policies: the driver (:class:`~fairagents.shared.SharedCounters`
live, the simulator on a virtual clock) moves :meth:`SharedView.payload` to a store and
:meth:`SharedView.apply` back; in between, the dispatcher asks :meth:`SharedView.gate`
before each dispatch, and the policy takes its lift's floor from the view.

**What a door may dispatch.** For a model whose capacity the doors share (remote
replicas every door sends to), the policy's choice runs only when

- the door holds a free slot of its **lease**: the slots the store granted it at the
  last sync (what it runs, plus free slots for what waits at it; see
  :mod:`fairagents.shared.store`). Leases never add up to more than the model's
  slots, so the doors together never hand the replicas more than their limit;
- the KV tokens reserved at every door, as of the last sync, leave room for it (this
  one is optimistic: two doors may both spend the same free tokens within a sync);
- it is the pool's turn for its app: no app waiting at another door has a lower
  counter (and no agent of the same app, at the agent level).

While a sync is on its way, a door runs no more requests of such a model than it
reported in it (the store may shrink its lease to that and hand the rest to others);
it reuses slots freed meanwhile up to that count. A slot a door frees and may not reuse (not its turn) goes to the others at its next
sync; a door that yields dispatches again at the next sync if the client it yielded
to did not take the slot. So no slot stays idle longer than about two sync intervals
while a request waits for it anywhere (work conservation up to that delay).

Examples:
    >>> import fairagents as fa
    >>> from fairagents.shared import SharedView
    >>> view = SharedView("door-a", fa.policies.HMFS())
    >>> view.payload(ttl=1000)["door"], view.connected
    ('door-a', False)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fairagents.errors import InvalidParameterError
from fairagents.policies.hmfs import HMFS
from fairagents.request import Request

if TYPE_CHECKING:
    from fairagents.dispatcher import Dispatcher, ModelState, Ticket
    from fairagents.shared.store import Payload, Reply

__all__ = ["SharedView"]


@dataclass(slots=True)
class _Elsewhere:
    """What the other doors hold of one model, as of the last sync."""

    running: int = 0
    reserved: int = 0
    """KV tokens their running requests reserve (raw tokens)."""
    apps: list[tuple[str, float]] = field(default_factory=list)
    """The two lowest-counter apps waiting there (two, so an app can skip itself)."""
    agents: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    """Per app of this door: its two lowest-counter agents waiting there."""


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
        self._elsewhere: dict[str, _Elsewhere] = {}
        self._lease: dict[str, int] = {}
        # While a payload is on its way, the door runs no more than it reported: the store may shrink
        # its lease to that, and the others may already be given the rest.
        self._frozen: dict[str, int] = {}
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
        if m.name not in self.shared_models:
            return True
        lease = self._lease.get(m.name)
        if lease is not None:
            frozen = self._frozen.get(m.name)
            if m.running >= (lease if frozen is None else min(lease, frozen)):
                return False
        there = self._elsewhere.get(m.name)
        if there is None:
            return True
        running = there.running + m.running
        budget = m.token_budget if m.budget_limit is None else m.budget_limit
        if budget is not None and running and there.reserved + m.reserved + ticket.reserved > budget:
            return False
        who = ticket.request.agent
        mine_app, mine_agent = self.policy.counters_of(who)
        app = who.app.name
        for other, counter in there.apps:
            if other != app:
                if counter < mine_app:
                    return False
                break
        for other, counter in there.agents.get(app, ()):
            if other != who.name:
                if counter < mine_agent:
                    return False
                break
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
        if self._inflight is None:
            self._seq += 1
            self._inflight = (self._seq, self._apps, self._agents)
            self._apps, self._agents = {}, {}
        seq, apps, agents = self._inflight
        running = {} if self.dispatcher is None else {
            m.name: [m.running, m.reserved] for m in self.dispatcher.models.values() if m.running}
        self._frozen = {name: running.get(name, (0, 0))[0] for name in self.shared_models}
        want = self.policy.clients()
        limits = {} if self.dispatcher is None else {
            name: m.slots for name, m in self.dispatcher.models.items() if name in self.shared_models}
        payload: Payload = {"door": self.door, "seq": seq, "ttl": int(ttl), "apps": apps, "agents": agents,
                            "waiting": self.policy.waiting_by_client(), "running": running, "limits": limits,
                            "want": want}
        if reconcile:  # this door's view, without what it charged alone
            alone_apps, alone_agents = self._alone_apps, self._alone_agents
            payload["raise"] = {
                "apps": {a: c - alone_apps.get(a, 0.0) for a, c in self.policy.app_counters().items()},
                "agents": {app: {g: c - alone_agents.get(app, {}).get(g, 0.0)
                                 for g, c in self.policy.agent_counters(app).items()} for app in want},
            }
        return payload

    def apply(self, reply: Reply, *, rebase: bool = False) -> None:
        """Take the pool's state: this door's counters are raised to the pool's plus its charges not yet sent.

        ``rebase`` (the first reply after the store was unreachable) sets them instead,
        lower or higher, and drops the charges made meanwhile: while apart, each door was
        fair among its own requests only, and counting that service would make an app
        that got more than its share wait, after the store is back, until the others
        caught up — for longer than the outage lasted. Otherwise counters only rise: a
        client lifted here since the payload left keeps its lift.
        """
        self._inflight = None
        self._frozen = {}
        self._alone_apps, self._alone_agents = {}, {}
        pending_apps, pending_agents = self._apps, self._agents
        for app, counter in reply["apps"].items():
            pending = pending_agents.get(app, {})
            agents = {a: c + pending.get(a, 0.0) for a, c in reply["agents"].get(app, {}).items()}
            self.policy.set_counters(app, counter + pending_apps.get(app, 0.0), agents, lower=rebase)
        elsewhere = {}
        for model, there in reply["others"].items():
            elsewhere[model] = _Elsewhere(
                int(there["running"]), int(there["reserved"]),
                [(a, float(c)) for a, c in there.get("apps") or ()],
                {app: [(a, float(c)) for a, c in low] for app, low in (there.get("agents") or {}).items()},
            )
        self._elsewhere = elsewhere
        self._lease = {m: int(n) for m, n in (reply.get("lease") or {}).items()}
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
        self._frozen = {}
        self._app_floor = self._app_left = None
        self._agent_floor, self._agent_left = {}, {}
        self.connected = False
        self.doors = 1

    def elsewhere(self, model: str) -> tuple[int, int]:
        """``(requests, reserved KV tokens)`` running for ``model`` at the other doors, by the last sync."""
        there = self._elsewhere.get(model)
        return (0, 0) if there is None else (there.running, there.reserved)


def _floor(active: float | None, outside: float | None, left: float | None, outside_left: float | None) -> float:
    """The lift's floor: the lowest active counter anywhere, else the highest of those that left last."""
    if active is not None or outside is not None:
        return min(x for x in (active, outside) if x is not None)
    lefts = [x for x in (left, outside_left) if x is not None]
    return max(lefts) if lefts else 0.0
