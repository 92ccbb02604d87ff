"""Play a workload through a policy and simulated engines on a virtual clock.

This is the simulator: :class:`~fairagents.engines.SimEngine` models engines, the
clock is virtual, and a run is deterministic. It exists to compare policies at scale
and to test their guarantees; real serving goes through the arbiter and real engines.
What runs is decided by the same :class:`~fairagents.dispatcher.Dispatcher` the
arbiter uses, with each engine's batch size as its slots and its KV capacity as its
token budget, so a property shown here is a property of the serving path. As in the
arbiter, a request is dispatched (and its input charged) the moment its model has
room, and joins the engine's running batch at the next step boundary. An app given a
``max_queued`` bound has its arrivals past it refused, as the arbiter answers them
(``OverloadedError``, the server's 429), and counted in :attr:`SimResult.rejected`.

Beside timed requests (:class:`Workload`) it plays runs of agent workflows
(:class:`Workflows`, :func:`simulate_workflows`): a run is stages of calls
(:class:`Shape`), each stage arriving when the previous one has fully finished, every
call carrying the run's id; closed-loop users start their next run when one completes.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.simulation import Workload, simulate
    >>> profile = fa.ModelProfile(d_model=4096, n_layers=1)
    >>> a, b = fa.Agent("bot", fa.App("a")), fa.Agent("bot", fa.App("b"))
    >>> work = Workload(seed=1).burst(a, "chat", n=40, prompt=32, output=16).burst(b, "chat", n=4, prompt=32, output=16)
    >>> fair = simulate(work, "hmfs", {"chat": fa.engines.SimEngine(profile, max_running=4)})
    >>> fcfs = simulate(work, "fcfs", {"chat": fa.engines.SimEngine(profile, max_running=4)})
    >>> def b_done(result):  # when b's last request finished
    ...     return max(r.finished for r in result.records if r.app == "b")
    >>> b_done(fair) < b_done(fcfs) / 3
    True
"""

from __future__ import annotations

from fairagents.simulation.result import SimResult
from fairagents.simulation.run import simulate, simulate_workflows
from fairagents.simulation.workflows import Call, Shape, SimRun, UserGroup, Workflows
from fairagents.simulation.workload import SimRequest, Workload

__all__ = [
    "Call", "Shape", "SimRequest", "SimResult", "SimRun", "UserGroup", "Workflows", "Workload", "simulate",
    "simulate_workflows",
]
