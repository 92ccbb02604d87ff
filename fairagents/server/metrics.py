"""Prometheus metrics of the server: ``GET /metrics``.

Every name starts with ``fairagents_`` and is in base units (``_seconds``, ``_total``
for counters, ``_ratio`` for shares); labels are ``app``, ``agent`` and ``model``
only, so the series count is bounded by the apps, agents and models configured.

Counters and histograms of requests are fed by the arbiter's record of each request
as it ends (:meth:`~fairagents.Arbiter.add_listener`), so cancelled and failed
requests count too. Service, queues, shares and model health are read from the
arbiter at scrape time. The metrics live in a registry of their own, not
prometheus_client's global one, so several servers in one process do not collide.

| metric | labels | what |
| --- | --- | --- |
| ``fairagents_requests_{finished,cancelled,failed}_total`` | app, agent, model | requests that ended so |
| ``fairagents_requests_rejected_total`` | app, agent, model | refused with 429: the app's queue was full |
| ``fairagents_{prompt,completion}_tokens_total`` | app, agent, model | raw tokens of requests that ran |
| ``fairagents_{queue_wait,ttft,request_duration}_seconds`` | app, agent, model | histograms, from arrival at the arbiter |
| ``fairagents_service_unified_tokens_total`` | app, agent | service charged, in unified tokens |
| ``fairagents_{queued,in_flight}_requests`` | app, agent | requests waiting, and running in an engine |
| ``fairagents_{app,agent}_{service,weight}_share_ratio`` | app (, agent) | share of service vs share of weight (agents: within their app) |
| ``fairagents_model_{up,in_flight_limit,queued_requests,in_flight_requests}`` | model | per-model health and load |
| ``fairagents_pool_in_flight_{requests,limit}`` | | requests running across the pool, and its limit (if set) |
| ``fairagents_draining`` | | 1 while the server drains after SIGTERM |

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

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fairagents.arbiter import Arbiter
from fairagents.metrics import RequestRecord
from fairagents.request import Outcome
from fairagents.server.fairness import FairnessView

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS", "Metrics"]

#: ``Content-Type`` of the exposition (Prometheus text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Histogram buckets in seconds: from a fast first token to a long wait behind a flood.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_LABELS = ("app", "agent", "model")


class Metrics:
    """The server's Prometheus registry.

    Args:
        arbiter: the arbiter whose requests are counted (a listener is added to it).
        view: the fairness view whose (cached) stats the scrape reads.
        draining: whether the server is draining.
        models: per-model figures by name (``healthy``, ``in_flight``, ``in_flight_limit``, ``queued``).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.server.fairness import FairnessView
        >>> from fairagents.server.metrics import Metrics
        >>> arbiter = fa.Arbiter()
        >>> b"fairagents_draining 0.0" in Metrics(arbiter, FairnessView(arbiter)).render()
        True
    """

    def __init__(
        self,
        arbiter: Arbiter,
        view: FairnessView,
        *,
        draining: Callable[[], bool] = lambda: False,
        models: Callable[[], dict[str, dict[str, Any]]] = dict,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
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
        self._wait = Histogram(
            "fairagents_queue_wait_seconds", "Arrival at the arbiter to dispatch to the engine.", _LABELS,
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self._ttft = Histogram(
            "fairagents_ttft_seconds", "Arrival at the arbiter to the first output token.", _LABELS,
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self._duration = Histogram(
            "fairagents_request_duration_seconds", "Arrival at the arbiter to the end of the request, however it ended.",
            _LABELS, buckets=LATENCY_BUCKETS, registry=r,
        )
        r.register(_Live(arbiter, view, draining, models))
        arbiter.add_listener(self.observe)

    def observe(self, record: RequestRecord) -> None:
        """Count a request that ended (the arbiter calls this)."""
        labels = (record.app, record.agent, record.model)
        self._ended[record.outcome].labels(*labels).inc()
        if record.dispatched is not None:
            self._prompt.labels(*labels).inc(record.prompt_tokens)
            self._wait.labels(*labels).observe(record.dispatched - record.arrival)
        if record.output_tokens:
            self._completion.labels(*labels).inc(record.output_tokens)
        if record.first_token is not None:
            self._ttft.labels(*labels).observe(record.first_token - record.arrival)
        self._duration.labels(*labels).observe(record.finished - record.arrival)

    def reject(self, app: str, agent: str, model: str) -> None:
        """Count a request refused because the app's queue was full."""
        self._rejected.labels(app, agent, model).inc()

    def render(self) -> bytes:
        """The exposition text (serve with :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class _Live(Collector):
    """What is read from the arbiter at scrape time."""

    def __init__(
        self,
        arbiter: Arbiter,
        view: FairnessView,
        draining: Callable[[], bool],
        models: Callable[[], dict[str, dict[str, Any]]],
    ):
        self._arbiter = arbiter
        self._view = view
        self._draining = draining
        self._models = models

    def collect(self) -> Iterator[Metric]:
        stats = self._view.stats()
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
        for key, agent in stats.agents.items():
            labels = key.split("/", 1)
            service.add_metric(labels, agent.service)
            queued.add_metric(labels, agent.queued)
            running.add_metric(labels, agent.in_flight)
            agent_share.add_metric(labels, agent.share)
            agent_weight.add_metric(labels, agent.weight_share)
        app_share = GaugeMetricFamily("fairagents_app_service_share_ratio", "An app's share of all service.", labels=("app",))
        app_weight = GaugeMetricFamily("fairagents_app_weight_share_ratio", "An app's weight over all apps' weights.", labels=("app",))
        for name, app in stats.apps.items():
            app_share.add_metric([name], app.share)
            app_weight.add_metric([name], app.weight_share)
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
        yield from (service, queued, running, agent_share, agent_weight, app_share, app_weight)
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

    def describe(self) -> Iterator[Metric]:
        return iter(())
