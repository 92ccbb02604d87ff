"""Prometheus metrics of the server: ``GET /metrics``.

Every name starts with ``fairagents_`` and is in base units (``_seconds``, ``_total``
for counters, ``_ratio`` for shares); labels are ``app``, ``agent`` and ``model`` only (and
``device`` on the device series: one of the pool's devices, set by configuration). The series are bounded whatever names requests bring (:class:`~fairagents.labels.LabelCap`):
the first ``max_agents`` agents of an app are named, later ones count as ``agent="_other"``,
apps past ``max_apps`` as ``app="_other"``; histograms have no ``agent`` label.

Counters and histograms of requests are fed by the arbiter's record of each request
as it ends (:meth:`~fairagents.Arbiter.add_listener`), so cancelled and failed
requests count too; those of runs (requests that name a run, :mod:`fairagents.runs`)
by each run as it completes, labelled by app only. Service, queues, shares and model health are read from the
arbiter at scrape time. The metrics live in a registry of their own, not
prometheus_client's global one, so several servers in one process do not collide.

| metric | labels | what |
| --- | --- | --- |
| ``fairagents_requests_{finished,cancelled,failed}_total`` | app, agent, model | requests that ended so |
| ``fairagents_requests_rejected_total`` | app, agent, model | refused with 429: the app's queue was full |
| ``fairagents_{prompt,completion}_tokens_total`` | app, agent, model | raw tokens of requests that ran |
| ``fairagents_{queue_wait,ttft,request_duration}_seconds`` | app, model | histograms, from arrival at the arbiter |
| ``fairagents_run_duration_seconds`` | app | histogram of completed runs, first arrival to last end |
| ``fairagents_run_{calls,service_unified_tokens}_total`` | app | requests, and service, of completed runs |
| ``fairagents_active_runs`` | app | runs not yet completed |
| ``fairagents_identities_refused_total`` | reason | new app or agent names refused (``max_apps``, ``max_agents``) |
| ``fairagents_service_unified_tokens_total`` | app, agent | service charged, in unified tokens |
| ``fairagents_{queued,in_flight}_requests`` | app, agent | requests waiting, and running in an engine |
| ``fairagents_{app,agent}_{service,weight}_share_ratio`` | app (, agent) | share of service vs share of weight (agents: within their app) |
| ``fairagents_device_service_unified_tokens_total`` | device, app | service charged on a device (its models), in unified tokens |
| ``fairagents_device_service_share_ratio`` | device, app | an app's share of a device's service (each device splits its own) |
| ``fairagents_model_{up,in_flight_limit,queued_requests,in_flight_requests}`` | model | per-model health and load |
| ``fairagents_pool_in_flight_{requests,limit}`` | | requests running across the pool, and its limit (if set) |
| ``fairagents_draining`` | | 1 while the server drains after SIGTERM |
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fairagents.labels import OTHER, LabelCap
from fairagents.metrics import RequestRecord
from fairagents.request import Outcome
from fairagents.runs import RunRecord
from fairagents.runtime.arbiter import Arbiter
from fairagents.server.fairness import FairnessView

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "OTHER", "RUN_BUCKETS", "LabelCap", "Metrics"]

#: ``Content-Type`` of the exposition (Prometheus text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Histogram buckets in seconds: from a fast first token to a long wait behind a flood.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

#: Histogram buckets of run durations in seconds: a run is one call, or a workflow of many.
RUN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

_LABELS = ("app", "agent", "model")
_APP_MODEL = ("app", "model")


class Metrics:
    """The server's Prometheus registry.

    Args:
        arbiter: the arbiter whose requests are counted (a listener is added to it).
        view: the fairness view whose (cached) stats the scrape reads.
        draining: whether the server is draining.
        models: per-model figures by name (``healthy``, ``in_flight``, ``in_flight_limit``, ``queued``).
        max_apps: apps named in labels (see :class:`~fairagents.labels.LabelCap`).
        max_agents: agents named in labels, per app.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.server.fairness import FairnessView
        >>> from fairagents.server.metrics import Metrics
        >>> arbiter = fa.Arbiter()
        >>> metrics = Metrics(arbiter, FairnessView(arbiter))
        >>> metrics.reject("driving", "planner", "chat")
        >>> [line for line in metrics.render().decode().splitlines() if line.startswith("fairagents_requests_rejected_total")]
        ['fairagents_requests_rejected_total{agent="planner",app="driving",model="chat"} 1.0']
    """

    def __init__(
        self,
        arbiter: Arbiter,
        view: FairnessView,
        *,
        draining: Callable[[], bool] = lambda: False,
        models: Callable[[], dict[str, dict[str, Any]]] = dict,
        max_apps: int = 64,
        max_agents: int = 16,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.cap = LabelCap(max_apps, max_agents)
        self._models_of: dict[tuple[str, str], set[str]] = {}  # the models each named (app, agent) has series of
        self._ended = {
            Outcome.FINISHED: Counter("fairagents_requests_finished", "Requests that ran to completion.", _LABELS, registry=r),
            Outcome.CANCELLED: Counter(
                "fairagents_requests_cancelled", "Requests the caller gave up (left the queue, or aborted while running).",
                _LABELS, registry=r,
            ),
            Outcome.FAILED: Counter(
                "fairagents_requests_failed", "Requests that failed (engine failure, or aborted at shutdown).", _LABELS, registry=r
            ),
        }
        self._rejected = Counter(
            "fairagents_requests_rejected", "Requests refused with 429 because the app's queue was full.", _LABELS, registry=r
        )
        self._prompt = Counter("fairagents_prompt_tokens", "Prompt tokens of requests that ran (raw tokens).", _LABELS, registry=r)
        self._completion = Counter("fairagents_completion_tokens", "Output tokens generated (raw tokens).", _LABELS, registry=r)
        self._refused = Counter(
            "fairagents_identities_refused", "New app or agent names refused (max_apps, max_agents).", ("reason",),
            registry=r,
        )
        # Histograms carry no agent label: 54 of an agent's 68 lines would be theirs.
        self._wait = Histogram(
            "fairagents_queue_wait_seconds", "Arrival at the arbiter to dispatch to the engine.", _APP_MODEL,
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self._ttft = Histogram(
            "fairagents_ttft_seconds", "Arrival at the arbiter to the first output token.", _APP_MODEL,
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self._duration = Histogram(
            "fairagents_request_duration_seconds", "Arrival at the arbiter to the end of the request, however it ended.",
            _APP_MODEL, buckets=LATENCY_BUCKETS, registry=r,
        )
        self._run_duration = Histogram(
            "fairagents_run_duration_seconds", "A completed run's first arrival to its last end.", ("app",),
            buckets=RUN_BUCKETS, registry=r,
        )
        self._run_calls = Counter("fairagents_run_calls", "Requests of completed runs.", ("app",), registry=r)
        self._run_service = Counter(
            "fairagents_run_service_unified_tokens", "Service charged to completed runs, in unified tokens.", ("app",),
            registry=r,
        )
        self._run_apps: set[str] = set()  # the apps with run series of their own (at most max_apps)
        self._live = _Live(arbiter, view, draining, models, self.cap, self._run_label)  # read on the loop
        self._built: tuple[float, asyncio.Future[bytes]] | None = None
        arbiter.add_listener(self.observe)
        arbiter.ledger.runs.listeners.append(self.observe_run)

    def _labels(self, app: str, agent: str, model: str) -> tuple[str, str, str]:
        app, agent = self.cap(app, agent)
        self._models_of.setdefault((app, agent), set()).add(model)
        return app, agent, model

    def observe(self, record: RequestRecord) -> None:
        """Count a request that ended (the arbiter calls this)."""
        labels = self._labels(record.app, record.agent, record.model)
        by_app = (labels[0], record.model)
        self._ended[record.outcome].labels(*labels).inc()
        if record.dispatched is not None:
            self._prompt.labels(*labels).inc(record.prompt_tokens)
            self._wait.labels(*by_app).observe(record.dispatched - record.arrival)
        if record.output_tokens:
            self._completion.labels(*labels).inc(record.output_tokens)
        if record.first_token is not None:
            self._ttft.labels(*by_app).observe(record.first_token - record.arrival)
        self._duration.labels(*by_app).observe(record.finished - record.arrival)

    def observe_run(self, run: RunRecord) -> None:
        """Count a run that completed (the arbiter's run book calls this)."""
        app = self._run_label(run.app)
        self._run_duration.labels(app).observe(run.duration)
        self._run_calls.labels(app).inc(run.calls)
        self._run_service.labels(app).inc(run.service)

    def _run_label(self, app: str) -> str:
        """An app's label on run series: its name, as on its request series, for at most ``max_apps`` apps."""
        if app not in self._run_apps:
            if len(self._run_apps) >= self.cap.max_apps or self.cap.app(app) == OTHER:
                return OTHER
            self._run_apps.add(app)
        return app

    def reject(self, app: str, agent: str, model: str) -> None:
        """Count a request refused because the app's queue was full."""
        self._rejected.labels(*self._labels(app, agent, model)).inc()

    def refuse(self, reason: str) -> None:
        """Count a new app or agent name refused (``reason``: ``"max_apps"`` or ``"max_agents"``); the name is not kept."""
        self._refused.labels(reason).inc()

    def forget(self, app: str, agent: str) -> None:
        """Drop an agent's series and free its labels (an agent counted as ``_other`` stays in that sum)."""
        if not self.cap.names(app, agent):
            return
        for model in self._models_of.pop((app, agent), ()):
            for counter in (*self._ended.values(), self._rejected, self._prompt, self._completion):
                with contextlib.suppress(KeyError):
                    counter.remove(app, agent, model)
        self.cap.forget(app, agent)
        if not any(a == app for a, _ in self._models_of):  # the app has no series left: nor histograms
            for histogram in (self._wait, self._ttft, self._duration):
                for model in self._histogram_models(histogram, app):
                    histogram.remove(app, model)
            for family in (self._run_duration, self._run_calls, self._run_service):
                with contextlib.suppress(KeyError):
                    family.remove(app)
            self._run_apps.discard(app)

    @staticmethod
    def _histogram_models(histogram: Histogram, app: str) -> list[str]:
        return [model for a, model in histogram._metrics if a == app]  # type: ignore[attr-defined]

    def render(self) -> bytes:
        """The exposition text (serve with :data:`CONTENT_TYPE`), built here and now."""
        return _format(self.registry, self._live.snapshot())

    async def exposition(self, max_age: float = 1.0) -> bytes:
        """:meth:`render`, with the arbiter read on the event loop and the text formatted in a thread.

        The counters and histograms are safe to read from a thread (prometheus_client locks
        them); the arbiter's live numbers are not, so they are copied first. Scrapes while
        one is built, or within ``max_age`` seconds after, share that build.
        """
        now = time.monotonic()
        if self._built is not None and (not self._built[1].done() or now - self._built[0] <= max_age):
            return await asyncio.shield(self._built[1])
        frozen = self._live.snapshot()
        built = asyncio.ensure_future(asyncio.to_thread(_format, self.registry, frozen))
        self._built = (now, built)
        return await asyncio.shield(built)


def _format(registry: CollectorRegistry, live: list[Metric]) -> bytes:
    frozen = CollectorRegistry(auto_describe=False)
    frozen.register(_Frozen(live))
    return generate_latest(registry) + generate_latest(frozen)


class _Frozen(Collector):
    """Families copied earlier, formatted later (in a thread)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)

    def describe(self) -> Iterator[Metric]:
        return iter(())


class _Live:
    """What is read from the arbiter at scrape time (on the event loop), its agents and apps under capped labels."""

    def __init__(
        self,
        arbiter: Arbiter,
        view: FairnessView,
        draining: Callable[[], bool],
        models: Callable[[], dict[str, dict[str, Any]]],
        cap: LabelCap,
        run_label: Callable[[str], str],
    ):
        self._arbiter = arbiter
        self._view = view
        self._draining = draining
        self._models = models
        self._cap = cap
        self._run_label = run_label

    def snapshot(self) -> list[Metric]:
        """The live families, numbers copied now."""
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        stats = self._view.stats()
        hidden = self._view.hidden
        by_agent: dict[tuple[str, str], list[float]] = {}
        for key, agent in stats.agents.items():
            app_name, agent_name = key.split("/", 1)
            if (app_name, agent_name) in hidden:
                continue
            sums = by_agent.setdefault(self._cap(app_name, agent_name), [0.0] * 5)
            for i, v in enumerate((agent.service, agent.queued, agent.in_flight, agent.share, agent.weight_share)):
                sums[i] += v
        by_app: dict[str, list[float]] = {}
        for name, app in stats.apps.items():  # every app, its agents all forgotten or not (only agents are forgotten)
            label = self._cap.app(name)
            sums = by_app.setdefault(label, [0.0, 0.0])
            sums[0] += app.share
            sums[1] += app.weight_share
        active_runs = GaugeMetricFamily("fairagents_active_runs", "Runs not yet completed.", labels=("app",))
        by_runs: dict[str, int] = {}
        for name, runs in stats.runs.items():
            label = self._run_label(name)
            by_runs[label] = by_runs.get(label, 0) + runs.active
        for name, active in by_runs.items():
            active_runs.add_metric([name], active)
        service = CounterMetricFamily(
            "fairagents_service_unified_tokens", "Service charged to an agent, in unified tokens.", labels=("app", "agent")
        )
        queued = GaugeMetricFamily("fairagents_queued_requests", "Requests waiting in the arbiter.", labels=("app", "agent"))
        running = GaugeMetricFamily(
            "fairagents_in_flight_requests", "Requests dispatched to an engine and not finished.", labels=("app", "agent")
        )
        agent_share = GaugeMetricFamily(
            "fairagents_agent_service_share_ratio", "An agent's share of its app's service.", labels=("app", "agent")
        )
        agent_weight = GaugeMetricFamily(
            "fairagents_agent_weight_share_ratio", "An agent's weight over its app's agents' weights.", labels=("app", "agent")
        )
        for labels, sums in by_agent.items():
            for family, value in zip((service, queued, running, agent_share, agent_weight), sums, strict=True):
                family.add_metric(labels, value)
        app_share = GaugeMetricFamily("fairagents_app_service_share_ratio", "An app's share of all service.", labels=("app",))
        app_weight = GaugeMetricFamily("fairagents_app_weight_share_ratio", "An app's weight over all apps' weights.", labels=("app",))
        for name, (share, weight_share) in by_app.items():
            app_share.add_metric([name], share)
            app_weight.add_metric([name], weight_share)
        up = GaugeMetricFamily("fairagents_model_up", "1 while the model's engine is healthy.", labels=("model",))
        limit = GaugeMetricFamily("fairagents_model_in_flight_limit", "Requests the model runs at once.", labels=("model",))
        model_queued = GaugeMetricFamily("fairagents_model_queued_requests", "Requests waiting for the model.", labels=("model",))
        model_running = GaugeMetricFamily("fairagents_model_in_flight_requests", "Requests the model runs now.", labels=("model",))
        for name, m in self._models().items():
            up.add_metric([name], 1.0 if m["healthy"] else 0.0)
            limit.add_metric([name], m["in_flight_limit"])
            model_queued.add_metric([name], m["queued"])
            model_running.add_metric([name], m["in_flight"])
        pool = [GaugeMetricFamily("fairagents_pool_in_flight_requests", "Requests running across the pool.",
                                  value=float(self._arbiter.pool_running))]
        if self._arbiter.pool_in_flight is not None:
            pool.append(GaugeMetricFamily("fairagents_pool_in_flight_limit", "Requests the pool runs at once.",
                                          value=float(self._arbiter.pool_in_flight)))
        draining = GaugeMetricFamily("fairagents_draining", "1 while the server drains after SIGTERM.", value=float(self._draining()))
        device_service = CounterMetricFamily(
            "fairagents_device_service_unified_tokens", "Service charged to an app on a device, in unified tokens.",
            labels=("device", "app"))
        device_share = GaugeMetricFamily(
            "fairagents_device_service_share_ratio", "An app's share of a device's service.", labels=("device", "app"))
        for device, served in stats.devices.items():
            total = sum(served.values())
            by_label: dict[str, float] = {}
            for name, amount in served.items():
                label = self._cap.app(name)
                by_label[label] = by_label.get(label, 0.0) + amount
            for label, amount in by_label.items():
                device_service.add_metric([device, label], amount)
                device_share.add_metric([device, label], amount / total if total else 0.0)
        yield from (service, queued, running, agent_share, agent_weight, app_share, app_weight, active_runs)
        yield from (device_service, device_share)
        yield from (up, limit, model_queued, model_running, *pool, draining)
        counters = self._arbiter.counters
        if counters is not None:
            status = counters.status()
            yield GaugeMetricFamily("fairagents_shared_counters_connected",
                                    "1 while the counters shared with other servers are reachable.",
                                    value=1.0 if status["connected"] else 0.0)
            yield GaugeMetricFamily("fairagents_shared_counters_doors", "Servers sharing the counters, as last seen.",
                                    value=float(status["doors"]))
            yield CounterMetricFamily("fairagents_shared_counters_syncs", "Syncs with the shared counters' store.",
                                      value=float(status["syncs"]))
            yield CounterMetricFamily("fairagents_shared_counters_sync_failures",
                                      "Syncs that did not reach the shared counters' store.", value=float(status["failures"]))
