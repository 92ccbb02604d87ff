"""The scenario model: its models, pool, apps, agents and their SLOs, trace, and real-engine version.

A :class:`Scenario` is what a scenario file holds once validated: simulated models
(:class:`ModelSpec`) and an optional limit they share (:class:`PoolSpec`), apps
(:class:`AppSpec`) of agents (:class:`AgentSpec`, each with its traffic and
:class:`SLOSpec`), an optional CSV trace (:class:`TraceSpec`), and how it scales down
for real engines (:class:`RealSpec`). Validation checks the whole: known models and
policies, traffic to play, a list cycled only over replicas.

Examples:
    >>> from fairagents.bench.spec import Scenario
    >>> bot = {"model": "chat", "arrival": {"process": "poisson", "rate": 1}, "prompt": 8, "output": 8}
    >>> scenario = Scenario.model_validate({"name": "s", "duration": 10, "models": {"chat": {}},
    ...                                     "apps": {"a": {"count": 2, "agents": {"b": bot}}}})
    >>> sorted(scenario.apps), scenario.apps["a"].count
    (['a'], 2)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal, NamedTuple

from pydantic import Field, PrivateAttr, Strict, model_validator

from fairagents.bench.spec.base import (
    Cycled,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    _lists,
    _pick,
    _problem,
    _runtime,
    _Spec,
)
from fairagents.bench.spec.distributions import ArrivalSpec, LengthSpec
from fairagents.cost import ModelProfile
from fairagents.engines.sim import SimEngine
from fairagents.identity import SLO, Modality

__all__ = ["AgentSpec", "AppSpec", "ModelSpec", "PoolSpec", "RealSpec", "SLOSpec", "Scenario", "TraceSpec"]

RealKind = Literal["text", "vision", "image"]


class SLOSpec(_Spec):
    """Latency objectives in seconds; on an agent, each may be a list cycled over its replicas.

    Examples:
        >>> from fairagents.bench.spec import SLOSpec
        >>> SLOSpec(ttft=4, e2e=[5, 8]).slo(k=1)
        SLO(ttft=4.0, tpot=None, e2e=8.0)
    """

    ttft: Cycled | None = None
    """Time to first token (seconds)."""
    tpot: Cycled | None = None
    """Time per output token after the first (seconds)."""
    e2e: Cycled | None = None
    """End to end, arrival to last token (seconds)."""

    def slo(self, k: int = 0, factor: float = 1.0) -> SLO:
        """The SLO of replica ``k`` (its lists cycled), times ``factor``."""
        values = {n: getattr(self, n) for n in ("ttft", "tpot", "e2e")}
        return SLO(**{n: _pick(v, k) * factor for n, v in values.items() if v is not None})


class AgentSpec(_Spec):
    """An agent (a role in an app) and the traffic it sends.

    Examples:
        >>> from fairagents.bench.spec import AgentSpec
        >>> AgentSpec(model="chat", arrival={"process": "poisson", "rate": 2}, prompt=64, output=16).arrival.rate
        2.0
    """

    weight: PositiveFloat = 1.0
    """Share of its app against the app's other agents."""
    model: str | None = None
    """The model it calls (a key of ``models``)."""
    slo: SLOSpec | None = None
    """Its SLO (falls back to the app's)."""
    arrival: ArrivalSpec | None = None
    """When its requests arrive; none: it sends nothing of its own (declared for a trace's rows)."""
    prompt: LengthSpec | None = None
    """Prompt tokens per request."""
    output: LengthSpec | None = None
    """Output tokens per request (cut to ``max_tokens``)."""
    max_tokens: PositiveInt | None = None
    """What each request asks for (reserved KV); none: exactly its output."""
    images: Annotated[int, Strict(), Field(ge=0)] | None = None
    """Images attached to each request on real engines; none: one on a vision model, else none. The simulator
    counts image tokens in ``prompt``."""
    timeout: PositiveFloat | None = None
    """Seconds after arrival at which the caller gives up (cancels)."""
    start: NonNegativeFloat = 0.0
    """Seconds into the scenario at which it starts sending."""
    end: PositiveFloat | None = None
    """Seconds into the scenario at which it stops sending; none: the scenario's end."""
    count: PositiveInt | None = None
    """Replicate it as ``count`` agents ``<name>-0`` … ``<name>-<count-1>``."""

    @model_validator(mode="after")
    def _check(self) -> AgentSpec:
        if self.arrival is not None:
            missing = [n for n in ("model", "prompt", "output") if getattr(self, n) is None]
            if missing:
                raise _problem(f"an agent with an arrival process needs {', '.join(missing)}")
        if self.end is not None and self.end <= self.start:
            raise _problem(f"end ({self.end:g}) must be after start ({self.start:g})")
        return self


class AppSpec(_Spec):
    """An app (a tenant) and its agents.

    Examples:
        >>> from fairagents.bench.spec import AppSpec
        >>> AppSpec(weight=2, agents={"bot": {"model": "chat"}}).agents["bot"].weight
        1.0
    """

    weight: PositiveFloat = 1.0
    """Share of the pool against other apps."""
    slo: SLOSpec | None = None
    """Default SLO of its agents (numbers, not lists)."""
    count: PositiveInt | None = None
    """Replicate it as ``count`` apps ``<name>-0`` … ``<name>-<count-1>``, each with all its agents."""
    agents: dict[str, AgentSpec] = {}
    """Its agents by name (an app only a trace sends for may declare none)."""

    @model_validator(mode="after")
    def _check(self) -> AppSpec:
        if self.slo is not None and _lists(self.slo):
            raise _problem("an app's SLO takes numbers; give per-replica lists in its agents' SLOs")
        return self


class ModelSpec(_Spec):
    """A simulated model: its cost profile and :class:`~fairagents.engines.SimEngine` parameters.

    Examples:
        >>> from fairagents.bench.spec import ModelSpec
        >>> ModelSpec(max_running=32, kv_capacity=10000).engine().max_running
        32
    """

    d_model: PositiveInt = 4096
    """Hidden width (unified tokens scale with it)."""
    n_layers: PositiveInt = 32
    """Layers (unified tokens scale with them)."""
    modality: RealKind = "text"
    """text (LLM), vision (images and text in) or image (image generation)."""
    max_running: PositiveInt = 16
    """Most sequences in the running batch."""
    kv_capacity: PositiveInt = 8192
    """KV cache size in tokens."""
    max_model_len: PositiveInt | None = None
    """Longest prompt + max_tokens (default: kv_capacity)."""
    prefill_per_token: NonNegativeFloat = 2e-5
    """Seconds of prefill per prompt token."""
    decode_base: NonNegativeFloat = 0.004
    """Seconds of a decode step with an empty batch."""
    decode_per_seq: NonNegativeFloat = 0.0004
    """Extra seconds of a step per sequence in the batch."""
    jitter: Annotated[float, Strict(), Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    """Relative step-time noise in [0, 1)."""
    kv: Literal["reserve", "paged"] = "reserve"
    """reserve: prompt + max_tokens per request; paged: vLLM-style paging with preemption."""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        self.engine(0)
        return self

    @property
    def context(self) -> int:
        """Longest prompt + max_tokens a request may have (tokens)."""
        return self.kv_capacity if self.max_model_len is None else min(self.max_model_len, self.kv_capacity)

    def engine(self, seed: int = 0) -> SimEngine:
        """A fresh simulated engine."""
        profile = ModelProfile(self.d_model, self.n_layers, Modality(self.modality))
        return _runtime(functools.partial(
            SimEngine, profile, max_running=self.max_running, kv_capacity=self.kv_capacity,
            max_model_len=self.max_model_len, prefill_per_token=self.prefill_per_token, decode_base=self.decode_base,
            decode_per_seq=self.decode_per_seq, jitter=self.jitter, seed=seed, kv=self.kv))


class PoolSpec(_Spec):
    """A limit shared by every model: the models run on the same hardware.

    Examples:
        >>> from fairagents.bench.spec import PoolSpec
        >>> PoolSpec(running=16).running
        16
    """

    running: PositiveInt
    """Most requests running across all models at once."""


class TraceSpec(_Spec):
    """A CSV trace to replay: columns timestamp, app, agent, model, input_tokens, output_tokens.

    Rows of apps and agents not declared in ``apps`` get weight 1 and no SLO; declared
    ones get their weights, SLO, timeout and max_tokens.

    Examples:
        >>> from fairagents.bench.spec import TraceSpec
        >>> TraceSpec(path="trace.csv").rebase
        True
    """

    path: str
    """The CSV file, relative to the scenario file."""
    rebase: bool = True
    """Shift timestamps so the first row arrives at 0."""


class RealSpec(_Spec):
    """How the scenario runs on real engines on a CPU: its timeline compressed into ``duration`` seconds.

    Examples:
        >>> from fairagents.bench.spec import RealSpec
        >>> RealSpec(duration=45, models={"llama": "text"}).max_output
        64
    """

    duration: PositiveFloat
    """Seconds of arrivals; the whole timeline is compressed into them (periods, rounds, phases too)."""
    rate_scale: PositiveFloat = 1.0
    """Rates on the real engines, as a multiple of the scenario's."""
    max_prompt: PositiveInt = 256
    """Prompts are cut to this many tokens."""
    max_output: PositiveInt = 64
    """Outputs and max_tokens are cut to this many tokens."""
    slo_scale: PositiveFloat = 1.0
    """Multiplies SLOs and timeouts."""
    models: Annotated[dict[str, RealKind], Field(min_length=1)]
    """Which embedded real engine plays each scenario model: text, vision or image."""


class Scenario(_Spec):
    """A benchmark scenario: models, apps and agents, their traffic, and how it scales down for real engines.

    Examples:
        >>> from fairagents.bench.spec import Scenario
        >>> bot = {"model": "chat", "arrival": {"process": "poisson", "rate": 1}, "prompt": 8, "output": 8}
        >>> scenario = Scenario.model_validate(
        ...     {"name": "s", "duration": 10, "models": {"chat": {}}, "apps": {"a": {"agents": {"b": bot}}}})
        >>> scenario.apps["a"].agents["b"].model
        'chat'
        >>> Scenario.model_validate({"name": "s", "duration": 10, "models": {"chat": {}},  # doctest: +ELLIPSIS
        ...                          "apps": {"a": {"agents": {"b": {**bot, "model": "gpt"}}}}})
        Traceback (most recent call last):
        ...
        pydantic_core._pydantic_core.ValidationError: 1 validation error for Scenario
          apps.a.agents.b.model: unknown model 'gpt'; known models: chat [type=scenario, input_value=..., input_type=dict]
    """

    name: Annotated[str, Field(min_length=1)]
    """Short name (a built-in's file name)."""
    description: str = ""
    """What it reproduces and what was chosen where the source is ambiguous."""
    duration: PositiveFloat
    """Seconds of arrivals (the run goes on until the backlog is served)."""
    seed: Annotated[int, Strict(), Field(ge=0)] = 0
    """Seed of every draw (≥ 0); the same seed gives the same requests."""
    models: Annotated[dict[str, ModelSpec], Field(min_length=1)]
    """Simulated models by name."""
    pool: PoolSpec | None = None
    """A limit the models share; none: each model has its own capacity."""
    apps: dict[str, AppSpec] = {}
    """Apps by name."""
    trace: TraceSpec | None = None
    """A CSV trace replayed beside the agents' own traffic."""
    real: RealSpec | None = None
    """The real-engine version; none: simulator only."""
    policies: list[str] | None = None
    """Policies it is meant to compare (default: all)."""

    _base: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        from fairagents.policies import POLICIES

        if self.trace is None and not any(a.arrival is not None for app in self.apps.values()
                                          for a in app.agents.values()):
            raise _problem("a scenario needs traffic: an agent with an arrival process, or a trace", ("apps",))
        seen: dict[str, tuple[str | int, ...]] = {}
        for client in _clients(self):
            spec, loc = client.agent, client.loc
            if spec.model is not None and spec.model not in self.models:
                known = ", ".join(sorted(self.models))
                raise _problem(f"unknown model {spec.model!r}; known models: {known}", (*loc, "model"))
            if spec.start >= self.duration:
                raise _problem(f"start ({spec.start:g}) is not before the scenario's end ({self.duration:g})",
                               (*loc, "start"))
            if spec.max_tokens is not None and spec.model is not None:
                context = self.models[spec.model].context
                if spec.max_tokens >= context:
                    raise _problem(f"max_tokens ({spec.max_tokens}) leaves no room for a prompt in the context of "
                                   f"model {spec.model!r} ({context} tokens)", (*loc, "max_tokens"))
            if client.replicas == 1:
                for name in ("slo", "arrival"):
                    if _lists(getattr(spec, name)):
                        raise _problem("a list of values is cycled over replicas: give the agent or its app a count",
                                       (*loc, name))
            key = f"{client.app}/{client.name}"
            if key in seen:
                raise _problem(f"two entries make the agent {key!r}", loc)
            seen[key] = loc
        if self.real is not None:
            missing = sorted(set(self.models) - set(self.real.models))
            if missing:
                raise _problem(f"no real engine named for model(s) {', '.join(missing)}", ("real", "models"))
            for name in self.real.models:
                if name not in self.models:
                    raise _problem(f"unknown model {name!r}; known models: {', '.join(sorted(self.models))}",
                                   ("real", "models", name))
        for i, policy in enumerate(self.policies or []):
            if policy not in POLICIES:
                raise _problem(f"unknown policy {policy!r}; choose from {', '.join(sorted(POLICIES))}", ("policies", i))
        return self


class _Client(NamedTuple):
    app: str
    name: str
    app_spec: AppSpec
    agent: AgentSpec
    k: int
    replicas: int
    loc: tuple[str, ...]


def _clients(scenario: Scenario) -> Iterator[_Client]:
    """Every agent the scenario makes, replicas expanded, with the index its cycled values are taken at."""
    for app_name, app in scenario.apps.items():
        for a in range(app.count or 1):
            for agent_name, agent in app.agents.items():
                n_agents = agent.count or 1
                for n in range(n_agents):
                    yield _Client(
                        f"{app_name}-{a}" if app.count else app_name,
                        f"{agent_name}-{n}" if agent.count else agent_name,
                        app, agent, a * n_agents + n, (app.count or 1) * n_agents,
                        ("apps", app_name, "agents", agent_name),
                    )
