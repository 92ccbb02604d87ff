"""Play a workload and workflow runs through a policy on simulated engines: :func:`simulate`, :func:`simulate_workflows`."""

from __future__ import annotations

from collections.abc import Mapping

from fairagents.admission import Statera, make_admission
from fairagents.cost import UnifiedTokenCost
from fairagents.engines.sim import SimEngine
from fairagents.errors import InvalidParameterError
from fairagents.identity import App
from fairagents.policies import Policy, make_policy
from fairagents.policies.devices import Devices, policy_factory
from fairagents.policies.pooled import PoolPolicy
from fairagents.request import Request
from fairagents.simulation.play import Flows, Player, VirtualClock, check_who
from fairagents.simulation.result import SimResult
from fairagents.simulation.workflows import Workflows
from fairagents.simulation.workload import SimRequest, Workload

__all__ = ["simulate", "simulate_workflows"]


def simulate(
    workload: Workload,
    policy: str | Policy,
    engines: Mapping[str, SimEngine],
    *,
    apps: Mapping[str, App] | None = None,
    d_base: int | None = None,
    pool_running: int | None = None,
    admission: str | Statera | None = None,
    max_queued: Mapping[str, int] | None = None,
    workflows: Workflows | None = None,
    devices: Mapping[str, str] | None = None,
    serial: Mapping[str, str] | None = None,
) -> SimResult:
    """Run ``workload`` through ``policy`` on ``engines`` (one per model) to the end.

    Args:
        workload: the timed requests.
        policy: a policy name (built with this run's unified cost) or a policy object.
        engines: model name → simulated engine (not shared between models).
        apps: if given, the only apps (and their agents, as :class:`Agent` objects in
            the workload) allowed; otherwise every app in the workload is allowed.
        d_base: ``d_base`` of the unified-token cost (default 4096).
        pool_running: most requests running across all ``"vllm"`` engines at once (the models
            share hardware), as :class:`~fairagents.Arbiter`'s ``pool_in_flight``: a
            slot freed on any engine goes to the policy's choice among every model
            with room (:meth:`~fairagents.policies.Policy.select_among`). A request
            given a slot joins its engine's batch at that engine's next step boundary.
            ``None``: each engine is filled on its own.
        admission: ``"statera"`` (a new :class:`~fairagents.Statera` for the run) or a
            :class:`~fairagents.Statera`: reservations by predicted bound and the two
            loops, as ``Arbiter(admission=...)``. It overcommits the worst case, so the
            engines must model what a real engine then does: ``SimEngine(kv="paged")``.
        max_queued: app name → the most requests it may have waiting for one model, as
            ``arbiter.app(name, max_queued=...)``: an arrival past it is refused (the
            arbiter's ``OverloadedError``, the server's 429) and counted in
            :attr:`SimResult.rejected`. Apps not named are unbounded.
        workflows: runs of agent workflows played beside ``workload``
            (:func:`simulate_workflows`); each run is recorded in :attr:`SimResult.runs`.
        devices: model name → its device (:mod:`fairagents.policies.devices`), as
            ``Arbiter.add_model(..., device=...)``: the engines of one device take one
            order with one set of counters (an engine holds back a client that is ahead
            while one owed more waits on another engine of the device; it looks again
            after every step), and they time-share it: one step of one of them runs at
            a time, the engines with work taking turns. Separate devices keep separate
            policies and step in parallel. ``None``: each engine is a device of its own.
        serial: model name → a group name: the engines of one group step one at a time
            (default: those of one device). The hardware may differ from the accounting:
            on one CPU, vLLM's in-process engines step one at a time (vLLM's forward
            context is global to the process) while a diffusion engine runs beside them.

    Engines with ``scheduler="fair"`` (:class:`~fairagents.engines.SimEngine`) model the
    default serving path: each request is handed to its engine as it arrives (within
    its app's share), and the engine orders, admits and preempts by its device's seat
    of the policy. With ``"vllm"`` engines, the dispatcher decides what each engine
    runs, as the arbiter does for ``VLLMEngine(scheduler="vllm")`` and for engines that
    do not schedule themselves (diffusers, remote replicas).

    Raises:
        BadInputError: a bad workload (an unknown model or app, a request that does not
            fit its engine, invalid lengths), before anything runs.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Workload, simulate
        >>> who = fa.Agent("a", fa.App("x"))
        >>> simulate(Workload().burst(who, "nope", n=1, prompt=1, output=1), "hmfs", {})
        Traceback (most recent call last):
        ...
        fairagents.errors.UnknownModelError: unknown model 'nope'; known models: none
    """
    if pool_running is not None and (isinstance(pool_running, bool) or not isinstance(pool_running, int)
                                     or pool_running < 1):
        raise InvalidParameterError(f"pool_running must be an integer ≥ 1 or None, got {pool_running!r}")
    cost = UnifiedTokenCost({m: e.profile for m, e in engines.items()}, **({"d_base": d_base} if d_base else {}))
    policy_obj = make_policy(policy, cost)
    fair = sorted(m for m, e in engines.items() if e.scheduler == "fair")
    if fair and (pool_running is not None or admission is not None):
        raise InvalidParameterError(
            f"pool_running and admission shape the dispatcher's admission; the engines of {', '.join(fair)} "
            "(scheduler='fair') admit by the policy themselves: use scheduler='vllm' engines with them")
    layout, clock = None, VirtualClock()
    if devices is not None or fair:
        if devices is not None and set(devices) != set(engines):
            raise InvalidParameterError(f"devices must name the device of every model and no other: got "
                                        f"{sorted(devices)} for {sorted(engines)}")
        layout = Devices(policy_factory(policy, policy_obj, cost), PoolPolicy(policy_obj, cost, clock=clock), cost)
        for model in engines:
            layout.assign(model, model if devices is None else devices[model])
            layout.seat(model).register(model, engines[model].profile)
    if serial is not None and set(serial) != set(engines):
        raise InvalidParameterError(f"serial must name the group of every model and no other: got {sorted(serial)} "
                                    f"for {sorted(engines)}")
    groups = dict(serial) if serial is not None else dict(devices) if devices is not None else {m: m for m in engines}
    controller = make_admission(admission)
    if controller is not None:
        reserving = sorted(m for m, e in engines.items() if e.kv != "paged")
        if reserving:
            raise InvalidParameterError(
                f"admission {controller.name!r} reserves less than max_tokens, so a simulated engine must model KV "
                f"as vLLM pages it and preempt: use SimEngine(kv='paged') for {', '.join(reserving)}")
    bounds = dict(max_queued or {})
    for app, bound in bounds.items():
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
            raise InvalidParameterError(f"max_queued must be an integer ≥ 1, got {bound!r}", app=app)
    requests = _validate(workload, engines, apps)
    flows = Flows(workflows, engines, apps) if workflows is not None else None
    run = Player(policy_obj, engines, cost, pool_running, controller, bounds, layout, clock, groups)
    return run.play(requests, flows)


def simulate_workflows(
    workflows: Workflows, policy: str | Policy, engines: Mapping[str, SimEngine], *, workload: Workload | None = None,
    **options: object,
) -> SimResult:
    """Play ``workflows`` (and an open-loop ``workload`` beside them, if given) through ``policy`` on ``engines``.

    Every call of a run carries the run's id (``Request.run``); a stage's calls arrive
    together the moment the previous stage's last call ends (a refused call counts as
    ended). :attr:`SimResult.runs` holds a :class:`SimRun` per run. ``options`` are
    :func:`simulate`'s (``apps``, ``d_base``, ``pool_running``, ``admission``,
    ``max_queued``, ``devices``, ``serial``).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.simulation import Shape, Workflows, simulate_workflows
        >>> bot = fa.Agent("bot", fa.App("x"))
        >>> flows = Workflows().run(Shape.chain(bot, "chat", 3, prompt=16, output=4), at=1.0)
        >>> result = simulate_workflows(flows, "fcfs", {"chat": fa.engines.SimEngine(fa.ModelProfile(4096, 1))})
        >>> [(r.label, r.calls, r.start) for r in result.runs]
        [('chain3', 3, 1.0)]
    """
    return simulate(workload or Workload(), policy, engines, workflows=workflows, **options)  # type: ignore[arg-type]


def _validate(
    workload: Workload, engines: Mapping[str, SimEngine], apps: Mapping[str, App] | None
) -> list[tuple[SimRequest, Request]]:
    out = []
    for i, item in enumerate(workload.requests):
        check_who(item.model, item.agent, engines, apps)
        max_tokens = item.output_tokens if item.max_tokens is None else item.max_tokens
        req = Request(f"r{i}", item.agent, item.model, item.prompt_tokens, max_tokens, item.at)
        if not 1 <= item.output_tokens <= max_tokens:
            raise InvalidParameterError(f"output_tokens must be in [1, max_tokens={max_tokens}], got {item.output_tokens}")
        engines[item.model].check(req)
        out.append((item, req))
    return out
