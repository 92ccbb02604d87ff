"""The fair scheduler's shares in vLLM's own ``/metrics``: service, queues and weights per app and agent.

| metric | labels | what |
| --- | --- | --- |
| ``fairagents_service_unified_tokens_total`` | model_name, engine, app, agent | service charged, in unified tokens (not divided by weight) |
| ``fairagents_queued_requests`` | model_name, engine, app, agent | requests in the engine waiting (preempted ones included) |
| ``fairagents_running_requests`` | model_name, engine, app, agent | requests in the engine's running batch |
| ``fairagents_app_weight`` | model_name, engine, app | the app's weight, as its latest request had it |
| ``fairagents_agent_weight`` | model_name, engine, app, agent | the agent's weight within its app, likewise |

``model_name`` and ``engine`` are vLLM's own labels. The scheduler runs in vLLM's
engine process and ``/metrics`` is served by the API server's: the series reach it
through prometheus_client's multiprocess mode (:data:`MULTIPROC_ENV`). Labels are
bounded (:class:`~fairagents.labels.LabelCap`): the first :data:`MAX_APPS` apps, and
the first :data:`MAX_AGENTS` agents of each, keep their names; later ones share
:data:`OVERFLOW`. The guide "Fair vLLM without the SDK" tells more.

Examples:
    >>> import fairagents as fa
    >>> from prometheus_client import CollectorRegistry
    >>> from fairagents.vllm.metrics import SchedulerMetrics
    >>> registry = CollectorRegistry()
    >>> metrics = SchedulerMetrics("chat", registry=registry)
    >>> planner = fa.Agent("planner", fa.App("search", weight=2))
    >>> metrics.observe(planner)
    >>> metrics.publish([("search", "planner", 30.0)], [(planner, True)])
    >>> labels = {"model_name": "chat", "engine": "0", "app": "search", "agent": "planner"}
    >>> registry.get_sample_value("fairagents_service_unified_tokens_total", labels)
    30.0
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from fairagents._logging import get_logger
from fairagents.identity import Agent
from fairagents.labels import OTHER, LabelCap

__all__ = ["MAX_AGENTS", "MAX_APPS", "MULTIPROC_ENV", "OVERFLOW", "SchedulerMetrics"]

log = get_logger(__name__)

#: Apps reported under their own label, per engine; later ones share :data:`OVERFLOW`.
MAX_APPS = 32
#: Agents of one app reported under their own label; later ones share :data:`OVERFLOW`.
MAX_AGENTS = 8
#: The label of the apps (or an app's agents) past the cap (the server's too).
OVERFLOW = OTHER
#: prometheus_client's variable naming the directory its processes share (multiprocess mode).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LABELS = ("model_name", "engine", "app", "agent")


@dataclass(frozen=True, slots=True)
class _Series:
    service: Counter
    queued: Gauge
    running: Gauge
    app_weight: Gauge
    agent_weight: Gauge


@functools.cache
def _series(registry: CollectorRegistry) -> _Series:
    """The metric families, once per registry and process (in multiprocess mode, gauges keep the latest value)."""
    def gauge(name: str, doc: str, labels: tuple[str, ...] = _LABELS) -> Gauge:
        return Gauge(name, doc, labels, registry=registry, multiprocess_mode="mostrecent")

    return _Series(
        service=Counter("fairagents_service_unified_tokens", "Service charged by the fair scheduler, in unified tokens.",
                        _LABELS, registry=registry),
        queued=gauge("fairagents_queued_requests", "Requests waiting in the engine (preempted ones included)."),
        running=gauge("fairagents_running_requests", "Requests in the engine's running batch."),
        app_weight=gauge("fairagents_app_weight", "The app's weight.", _LABELS[:3]),
        agent_weight=gauge("fairagents_agent_weight", "The agent's weight within its app."),
    )


class SchedulerMetrics:
    """One engine's fairness series, with bounded labels.

    Args:
        model_name: vLLM's ``model_name`` label (the served model name).
        engine: vLLM's ``engine`` label (the engine's data-parallel index).
        max_apps: apps reported under their own label.
        max_agents: agents of one app reported under their own label.
        interval: least seconds between two publications (:meth:`due`).
        registry: where the series are registered: prometheus_client's global one by
            default, which vLLM's ``/metrics`` serves when the engine shares its process
            (in multiprocess mode the files carry them, whatever the registry).
        clock: seconds, monotonic.

    Examples:
        >>> import fairagents as fa
        >>> from prometheus_client import CollectorRegistry
        >>> from fairagents.vllm.metrics import SchedulerMetrics
        >>> metrics = SchedulerMetrics("chat", max_apps=1, registry=CollectorRegistry())
        >>> metrics.labels(fa.Agent("a", fa.App("one"))), metrics.labels(fa.Agent("a", fa.App("two")))
        (('one', 'a'), ('_other', '_other'))
    """

    def __init__(self, model_name: str, engine: str = "0", *, max_apps: int = MAX_APPS, max_agents: int = MAX_AGENTS,
                 interval: float = 0.5, registry: CollectorRegistry = REGISTRY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._base = (model_name, engine)
        self._cap = LabelCap(max_apps, max_agents)
        self._series = _series(registry)
        self._clock = clock
        self._next = 0.0
        self._app_weights: dict[str, float] = {}  # app label -> the latest weight
        self._agent_weights: dict[tuple[str, str], float] = {}  # (app, agent) labels -> the latest weight
        self._published: dict[tuple[str, str], float] = {}  # (app, agent) labels -> service published so far
        self._counted: set[tuple[str, str]] = set()  # labels whose request gauges were ever set

    @classmethod
    def for_engine(cls, vllm_config: Any) -> SchedulerMetrics:
        """The series of the engine ``vllm_config`` configures, under vLLM's labels; warns if they cannot reach ``/metrics``."""
        import vllm.envs

        if vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING and MULTIPROC_ENV not in os.environ:
            log.warning("fairagents.vllm.metrics_unexported", fix=f"{MULTIPROC_ENV}=$(mktemp -d) in the server's environment",
                        reason="the fair scheduler's metrics stay in the engine process, out of /metrics")
        parallel = vllm_config.parallel_config
        engine = getattr(parallel, "data_parallel_index", getattr(parallel, "data_parallel_rank", 0))
        return cls(str(vllm_config.model_config.served_model_name), str(engine))

    def labels(self, agent: Agent) -> tuple[str, str]:
        """The ``(app, agent)`` label values of ``agent``: its names, or :data:`OVERFLOW` past the caps."""
        return self._cap(agent.app.name, agent.name)

    def observe(self, agent: Agent) -> None:
        """Note a request's agent as it arrives: its labels, and its weights as the latest ones."""
        app, name = self.labels(agent)
        if app != OVERFLOW:
            self._app_weights[app] = agent.app.weight
            if name != OVERFLOW:
                self._agent_weights[(app, name)] = agent.weight

    def due(self) -> bool:
        """Whether :attr:`interval` has passed since the last publication."""
        return self._clock() >= self._next

    def publish(self, service: Iterable[tuple[str, str, float]], requests: Iterable[tuple[Agent, bool]]) -> None:
        """Publish the figures now.

        Args:
            service: ``(app, agent, unified tokens)``, the service charged so far (totals, every agent's:
                the agents that share a label are summed).
            requests: ``(agent, running)`` of each request the engine holds.
        """
        self._next = self._clock() + self.interval
        series, base = self._series, self._base
        totals: dict[tuple[str, str], float] = {}  # by label: what is kept is bounded by the caps, not by the names
        for app, agent, total in service:
            labels = self._cap(app, agent)
            totals[labels] = totals.get(labels, 0.0) + total
        for labels, total in totals.items():
            done = self._published.get(labels, 0.0)
            if total > done:
                self._published[labels] = total
                series.service.labels(*base, *labels).inc(total - done)
        counts = dict.fromkeys(self._counted, (0, 0))
        for agent, running in requests:
            labels = self.labels(agent)
            queued, run = counts.get(labels, (0, 0))
            counts[labels] = (queued, run + 1) if running else (queued + 1, run)
        for labels, (queued, run) in counts.items():
            series.queued.labels(*base, *labels).set(queued)
            series.running.labels(*base, *labels).set(run)
        self._counted.update(counts)
        for app, weight in self._app_weights.items():
            series.app_weight.labels(*base, app).set(weight)
        for (app, agent), weight in self._agent_weights.items():
            series.agent_weight.labels(*base, app, agent).set(weight)
