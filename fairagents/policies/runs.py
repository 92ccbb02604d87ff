"""HMFS with a run level: apps share the pool by weight, and inside an app the runs share it fairly.

A **run** is one invocation of an agent workflow (``Request.run``; a call without one is
a run of its own). Apps are chosen as in :class:`~fairagents.policies.HMFS` (weighted
counters, unified tokens, the same ``2U`` bound between apps). Inside an app, calls are
ordered by **start-time fair queueing over runs**: each run is a flow, each call a
packet of it.

- A call's tag is its run's finish tag so far (the service the run has asked for and
  received, over the calling agent's weight), lifted to the app's virtual time so an
  idle run banks no credit, but never past the finish of the first call waiting for the
  same model. Lowest tag first, then arrival.
- A run's tag grows by each call's prompt cost when the call arrives, and by its output
  as it streams, so the calls of a fan-out are spread over the run's fair share: a run
  that fans out 100 calls cannot hold the app while other runs wait, and a new run's
  first call goes right after the first call waiting for its model, not behind a whole fan-out.
- Tags grow with service, never with waiting: a run that has received more goes later,
  and one that waits is overtaken only by runs that have received less. The virtual time
  also grows with the app's service over its active runs (as in processor sharing), so
  a stream of new runs cannot keep one waiting: every run finishes.

Agent weights scale what a call adds to its run's tag. Idle runs are forgotten after
``run_memory`` seconds (and past ``max_runs``, the longest idle first), so run state is
bounded. See *Scheduling agent workflows* in the docs for when it pays.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from typing import ClassVar

from fairagents.cost import CostModel
from fairagents.errors import InvalidParameterError
from fairagents.policies.hmfs import HMFS
from fairagents.request import Outcome, Request

__all__ = ["HMFSRuns"]

_RunKey = tuple[str, str]  # (app, run)


class HMFSRuns(HMFS):
    """HMFS between apps; inside an app, fair queueing over workflow runs (see the module docs).

    Args:
        cost: how tokens are charged (as :class:`~fairagents.policies.HMFS`).
        run_memory: seconds an idle run's tag is kept (its next stage continues from it).
        max_runs: most runs whose tags are kept at once; past it the longest idle is forgotten.

    Examples:
        One run fans out five calls; another run's call, arriving later, need not wait for all five:

        >>> import fairagents as fa
        >>> cost = fa.UnifiedTokenCost({"chat": fa.ModelProfile(d_model=4096, n_layers=1)})
        >>> policy = fa.policies.HMFSRuns(cost)
        >>> worker = fa.Agent("worker", fa.App("news"))
        >>> for i in range(5):
        ...     policy.on_arrival(fa.Request(f"map{i}", worker, "chat", 10, 4, 0.0, run="digest"), now=0.0)
        >>> policy.on_arrival(fa.Request("ask", worker, "chat", 10, 4, 1.0, run="question"), now=1.0)
        >>> order = []
        >>> while (r := policy.select("chat", 1.0)) is not None:
        ...     policy.on_dispatch(r, 1.0); order.append(r.id)
        >>> order
        ['map0', 'ask', 'map1', 'map2', 'map3', 'map4']
    """

    name: ClassVar[str] = "hmfs_runs"
    charges_by_client: ClassVar[bool] = False  # its charge also goes to the request's run

    def __init__(self, cost: CostModel | None = None, *, run_memory: float = 300.0, max_runs: int = 100_000) -> None:
        if isinstance(run_memory, bool) or not isinstance(run_memory, int | float) or not run_memory > 0:
            raise InvalidParameterError(f"run_memory must be > 0 seconds, got {run_memory!r}")
        if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
            raise InvalidParameterError(f"max_runs must be an integer ≥ 1, got {max_runs!r}")
        super().__init__(cost)
        self.run_memory, self.max_runs = run_memory, max_runs
        self._finish: dict[_RunKey, float] = {}  # run -> finish tag so far
        self._active: dict[_RunKey, int] = {}  # run -> calls waiting or running
        self._n_active: dict[str, int] = {}  # app -> its runs with calls waiting or running
        self._idle: OrderedDict[_RunKey, float] = OrderedDict()  # idle runs, longest idle first -> since when
        self._vtime: dict[str, float] = {}  # app -> tag of the last call dispatched
        self._tag: dict[str, float] = {}  # call id -> its start tag, while it waits
        self._heaps: dict[tuple[str, str], list[tuple[float, float, int, Request]]] = {}  # (app, model) -> calls
        self._waiting_in: dict[str, dict[str, int]] = {}  # app -> model -> calls waiting in its heap
        self._entry: dict[str, int] = {}  # call id -> its heap entry, while it waits
        self._gone: set[int] = set()  # entries of calls that left, until they surface (or their heap empties)
        self._seq = itertools.count()

    def run_tags(self, app: str) -> dict[str, float]:
        """The finish tag of each run of ``app`` kept now (a call that named no run: ``~<request id>``)."""
        return {run: tag for (a, run), tag in self._finish.items() if a == app}

    def select(self, model: str, now: float) -> Request | None:
        app = self._apps.lowest(model)
        if app is None:
            return None
        return self._top((app, model))[3]

    def _top(self, key: tuple[str, str]) -> tuple[float, float, int, Request]:
        heap = self._heaps[key]
        while heap[0][2] in self._gone:
            self._gone.discard(heapq.heappop(heap)[2])
        return heap[0]

    def _cost(self, req: Request) -> float:
        """What a call's prompt adds to its run's tag."""
        return self.cost.input_cost(req.model, req.prompt_tokens) / req.agent.weight

    def _cap(self, app: str, model: str) -> float:
        """Just below the finish tag of the first call of ``app`` waiting for ``model`` (infinite when none waits).

        A new run's call tagged under it goes after that call and before the rest of its run; as
        the first calls go, the cap rises with them, so the runs waiting are never held back for good.
        """
        if not self._waiting_in.get(app, {}).get(model):
            return math.inf
        start, _, _, first = self._top((app, model))
        return math.nextafter(start + self._cost(first), -math.inf)

    def _rank(self, req: Request) -> tuple[float, float, float]:
        return self._apps.counter[req.agent.app.name], self._tag[req.id], req.arrival

    def _enqueue(self, req: Request, now: float) -> None:
        super()._enqueue(req, now)
        run, app = req.run_key, req.agent.app.name
        if self._active.get(run, 0) == 0:
            self._idle.pop(run, None)
            self._n_active[app] = self._n_active.get(app, 0) + 1
        self._active[run] = self._active.get(run, 0) + 1
        # Lifted to the virtual time, but never past a call already waiting: a new run goes after at most
        # one call of each run ahead of it, however far the service of running calls has aged the time.
        floor = min(self._vtime.get(app, 0.0), self._cap(app, req.model))
        start = max(floor, self._finish.get(run, 0.0))
        self._finish[run] = start + self._cost(req)
        self._tag[req.id] = start
        key, seq = (app, req.model), next(self._seq)
        heap = self._heaps.setdefault(key, [])
        heapq.heappush(heap, (start, req.arrival, seq, req))
        self._entry[req.id] = seq
        waiting = self._waiting_in.setdefault(app, {})
        waiting[req.model] = n = waiting.get(req.model, 0) + 1
        if len(heap) > 2 * n + 32:  # mostly entries of calls that left: rebuilt, so it stays bounded
            gone = self._gone
            live = [entry for entry in heap if entry[2] not in gone]
            gone.difference_update(entry[2] for entry in heap if entry[2] in gone)
            heapq.heapify(live)
            self._heaps[key] = live
        self._forget_idle(now)

    def _dequeue(self, req: Request, now: float, dispatched: bool) -> None:
        super()._dequeue(req, now, dispatched)
        app = req.agent.app.name
        self._gone.add(self._entry.pop(req.id))
        waiting = self._waiting_in[app]
        left = waiting[req.model] - 1
        if left:
            waiting[req.model] = left
        else:  # nothing of the app waits for the model: its heap goes, lazily deleted entries with it
            del waiting[req.model]
            if not waiting:
                del self._waiting_in[app]
            self._gone.difference_update(entry[2] for entry in self._heaps.pop((app, req.model)))
        start = self._tag.pop(req.id)
        if dispatched:
            if start > self._vtime.get(app, 0.0):
                self._vtime[app] = start
            return
        run = req.run_key  # withdrawn while it waited: its run asked for nothing, if it was the run's last call
        if self._finish.get(run) == start + self._cost(req):
            self._finish[run] = start
        self._leave(req, now)

    def on_progress(self, req: Request, new_output_tokens: int, now: float) -> None:
        super().on_progress(req, new_output_tokens, now)
        run = req.run_key
        if run in self._finish:  # the output it asked for goes on its run's account
            self._finish[run] += self._output_cost(req.model, new_output_tokens) / req.agent.weight

    def _charge(self, req: Request, amount: float, now: float) -> None:
        super()._charge(req, amount, now)
        app = req.agent.app.name  # processor sharing among the app's active runs: the virtual time's aging
        self._vtime[app] = self._vtime.get(app, 0.0) + amount / req.agent.weight / self._n_active[app]

    def on_finish(self, req: Request, outcome: Outcome, now: float) -> None:
        running = req.id in self._running
        super().on_finish(req, outcome, now)
        if running:
            self._leave(req, now)

    def _leave(self, req: Request, now: float) -> None:
        """``req`` neither waits nor runs any more; its run may go idle."""
        run = req.run_key
        left = self._active[run] - 1
        if left:
            self._active[run] = left
            return
        del self._active[run]
        app = req.agent.app.name
        self._n_active[app] -= 1
        if not self._n_active[app]:
            del self._n_active[app]
        if req.run is None:  # a call that named no run was a run of its own: over now
            self._finish.pop(run, None)
        else:
            self._idle[run] = now
            self._forget_idle(now)

    def _forget_idle(self, now: float) -> None:
        idle = self._idle
        while idle:
            run, since = next(iter(idle.items()))
            if now - since < self.run_memory and len(self._finish) <= self.max_runs:
                return
            idle.popitem(last=False)
            del self._finish[run]
