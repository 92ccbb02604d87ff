"""Scenario files: a YAML description of models, apps, agents and their traffic, and the workload it builds.

A scenario names simulated models (engine parameters and cost profile), the apps that
share them (weights, agents, SLOs) and, per agent, an arrival process
(:mod:`fairagents.bench.arrivals`) and prompt and output length distributions
(:mod:`fairagents.bench.lengths`); optionally a CSV trace to replay, a shared pool
limit, and how it scales down for real engines on a CPU.
:func:`load_scenario` reads one (a built-in name or a file) into a validated
:class:`Scenario`; :func:`build` draws its requests, deterministic for a seed, as a
:class:`~fairagents.simulation.Workload` with simulated engines ready for
:func:`~fairagents.simulation.simulate`.

The format is in the guide "Scenario files"; its JSON schema is
``docs/scenario.schema.json`` (:func:`scenario_json_schema`, printed by
``python -m fairagents.bench.spec``).

Everything is imported from here; the parts live in ``base`` (field types, errors),
``distributions`` (length and arrival entries), ``models`` (:class:`Scenario` and its
parts), ``loading`` (YAML files, built-ins, schema) and ``building`` (:func:`build`).

Examples:
    >>> from fairagents.bench.spec import build, load_scenario
    >>> from fairagents.simulation import simulate
    >>> scenario = load_scenario("vtc-overload").model_copy(update={"duration": 10.0})
    >>> built = build(scenario)
    >>> sorted(built.apps), sorted(built.engines)
    (['client-0', 'client-1'], ['llama-2-7b'])
    >>> result = simulate(built.workload, "vtc", built.engines, apps=built.apps)
    >>> len(result.records) == len(built.workload)
    True
"""

from __future__ import annotations

from fairagents.bench.spec.base import (
    Cycled,
    FiniteFloat,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ScenarioError,
    ScenarioProblem,
)
from fairagents.bench.spec.building import Built, build
from fairagents.bench.spec.distributions import (
    ArrivalSpec,
    BaseArrival,
    ConstantLength,
    EmpiricalLength,
    ExFairSArrival,
    FormulaArrival,
    GammaArrival,
    HMASStressArrival,
    LengthDist,
    LengthSpec,
    LogNormalLength,
    MixtureLength,
    MixturePart,
    NormalLength,
    OnOffArrival,
    PiecewiseArrival,
    PoissonArrival,
    UniformLength,
)
from fairagents.bench.spec.loading import builtin_scenarios, load_scenario, scenario_json_schema
from fairagents.bench.spec.models import (
    AgentSpec,
    AppSpec,
    ModelSpec,
    PoolSpec,
    RealKind,
    RealSpec,
    Scenario,
    SLOSpec,
    TraceSpec,
)

__all__ = [
    "AgentSpec",
    "AppSpec",
    "ArrivalSpec",
    "BaseArrival",
    "Built",
    "ConstantLength",
    "Cycled",
    "EmpiricalLength",
    "ExFairSArrival",
    "FiniteFloat",
    "FormulaArrival",
    "GammaArrival",
    "HMASStressArrival",
    "LengthDist",
    "LengthSpec",
    "LogNormalLength",
    "MixtureLength",
    "MixturePart",
    "ModelSpec",
    "NonNegativeFloat",
    "NormalLength",
    "OnOffArrival",
    "PiecewiseArrival",
    "PoissonArrival",
    "PoolSpec",
    "PositiveFloat",
    "PositiveInt",
    "RealKind",
    "RealSpec",
    "SLOSpec",
    "Scenario",
    "ScenarioError",
    "ScenarioProblem",
    "TraceSpec",
    "UniformLength",
    "build",
    "builtin_scenarios",
    "load_scenario",
    "scenario_json_schema",
]
