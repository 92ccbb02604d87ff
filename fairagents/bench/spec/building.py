"""Building a scenario: its requests drawn, deterministic for a seed, for the simulator or for real engines.

:func:`build` expands every agent's replicas, draws its arrival times and lengths from
a generator of its own, replays the scenario's CSV trace beside them, and returns a
:class:`Built`: the :class:`~fairagents.simulation.Workload`, fresh simulated engines,
the apps, and what a real run needs (the engine kind of each model, the images of each
agent's requests).

Examples:
    >>> from fairagents.bench.spec import build, load_scenario
    >>> built = build(load_scenario("duet"), engine="real")
    >>> built.real_models, built.images[("text", "chat")], built.images[("multimodal", "caption")]
    ({'qwen2-vl-7b': 'vision'}, 0, 1)
"""

from __future__ import annotations

import csv
import functools
import math
import zlib
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from fairagents.bench.spec.base import MAX_INT, ScenarioError
from fairagents.bench.spec.distributions import _distribution, _mtime, _resolve
from fairagents.bench.spec.models import AgentSpec, AppSpec, RealSpec, Scenario, _clients
from fairagents.engines.sim import SimEngine
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent, App
from fairagents.simulation import SimRequest, Workload

__all__ = ["Built", "build"]


@dataclass
class Built:
    """A scenario drawn into requests: what :func:`~fairagents.simulation.simulate` or a real run needs.

    Examples:
        >>> from fairagents.bench.spec import build, load_scenario
        >>> built = build(load_scenario("hmfs-shared-pool"), engine="real")
        >>> built.engines, built.pool_running is not None, sorted(set(built.real_models.values()))
        ({}, True, ['image', 'text', 'vision'])
    """

    scenario: Scenario
    """The scenario it came from."""
    workload: Workload
    """The requests, sorted by arrival (seconds)."""
    engines: dict[str, SimEngine]
    """A fresh simulated engine per model (empty for real engines)."""
    apps: dict[str, App]
    """Every app of the workload by name (pass as ``simulate(apps=...)``)."""
    pool_running: int | None
    """The shared pool limit (``simulate(pool_running=...)``), if any."""
    duration: float
    """Seconds of arrivals."""
    real_models: dict[str, str] = field(default_factory=dict)
    """Scenario model → embedded real engine kind (text, vision, image); only for real engines."""
    images: dict[tuple[str, str], int] = field(default_factory=dict)
    """(app, agent) → images attached to each of its requests on real engines (agents the scenario declares)."""


def build(scenario: Scenario, *, engine: Literal["sim", "real"] = "sim", seed: int | None = None,
          scale: float = 1.0) -> Built:
    """Draw ``scenario``'s requests, for the simulator or for real engines.

    Each agent draws from its own generator, seeded by ``seed`` (default: the scenario's)
    and its name, so the same seed gives the same requests, and adding an agent does not
    change the others'. ``scale`` multiplies every arrival rate (a load sweep; a trace
    plays ``scale`` times faster, or keeps each row with probability ``scale`` below 1).

    Lengths: an output is cut to the agent's ``max_tokens``; on the simulator a prompt is
    cut to fit the model's context beside ``max_tokens``, as a client truncates its input.
    ``engine="real"`` plays the timeline compressed into ``real.duration`` seconds at
    ``real.rate_scale`` times the rates, cuts prompts and outputs to ``real.max_prompt``
    and ``real.max_output``, and scales SLOs and timeouts by ``real.slo_scale``.

    Raises:
        ScenarioError: ``engine="real"`` for a scenario without a ``real`` block, or a bad trace or lengths file.
        InvalidParameterError: an unknown ``engine``, a ``scale`` ≤ 0 or a negative ``seed``.

    Examples:
        >>> from fairagents.bench.spec import build, load_scenario
        >>> scenario = load_scenario("exfairs-1").model_copy(update={"duration": 60.0})
        >>> a, b = build(scenario, seed=3), build(scenario, seed=3)
        >>> a.workload.requests == b.workload.requests
        True
        >>> len(build(scenario, seed=3, scale=2.0).workload) > len(a.workload)
        True
    """
    if engine not in ("sim", "real"):
        raise InvalidParameterError(f"engine must be 'sim' or 'real', got {engine!r}")
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
        raise InvalidParameterError(f"scale must be a finite number > 0, got {scale!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise InvalidParameterError(f"seed must be an integer ≥ 0, got {seed!r}")
    seed = scenario.seed if seed is None else seed
    real = scenario.real
    if engine == "real" and real is None:
        raise ScenarioError(f"scenario {scenario.name!r} has no real-engine version (no 'real' block)",
                            source=scenario.name)
    if real is not None and engine == "real":
        squeeze, rates, slo_scale, duration = real.duration / scenario.duration, real.rate_scale, real.slo_scale, \
            real.duration
    else:
        real, squeeze, rates, slo_scale, duration = None, 1.0, 1.0, 1.0, scenario.duration
    rate_factor = scale * rates * squeeze  # rates on the scenario's timeline, before it is compressed
    apps: dict[str, App] = {}
    agents: dict[tuple[str, str], tuple[Agent, AgentSpec | None]] = {}
    requests: list[SimRequest] = []
    images: dict[tuple[str, str], int] = {}
    for client in _clients(scenario):
        app = apps.get(client.app)
        if app is None:
            app = apps[client.app] = _app(client.app, client.app_spec, slo_scale)
        spec = client.agent
        agent = Agent(client.name, app, slo=spec.slo.slo(client.k, slo_scale) if spec.slo else None,
                      **({"weight": spec.weight} if "weight" in spec.model_fields_set else {}))
        agents[(app.name, agent.name)] = (agent, spec)
        if spec.model is not None:
            vision = scenario.models[spec.model].modality == "vision"
            images[(app.name, agent.name)] = spec.images if spec.images is not None else int(vision)
        if spec.arrival is None:
            continue
        rng = np.random.default_rng([seed, zlib.crc32(f"{app.name}/{agent.name}".encode())])
        end = scenario.duration if spec.end is None else min(spec.end, scenario.duration)
        times = spec.arrival.arrival(client.k).scaled(rate_factor).times(rng, spec.start, end)
        n = len(times)
        assert spec.prompt is not None and spec.output is not None and spec.model is not None  # AgentSpec checks
        try:
            prompts = _distribution(spec.prompt, scenario._base).sample(rng, n)
            outputs = _distribution(spec.output, scenario._base).sample(rng, n)
        except ScenarioError:
            raise
        except InvalidParameterError as err:  # a lengths file that cannot be read (changed since it was loaded)
            raise ScenarioError(f"{scenario.name}: {'.'.join(client.loc)}: {err}", source=scenario.name) from None
        requests.extend(_requests(scenario, agent, spec.model, times * squeeze, prompts, outputs, spec, real,
                                  slo_scale))
    if scenario.trace is not None:
        requests.extend(_trace(scenario, apps, agents, scale * rates, squeeze, duration, real, slo_scale, seed))
    requests.sort(key=lambda r: (r.at, r.agent.app.name, r.agent.name))
    return Built(
        scenario=scenario,
        workload=Workload(requests, seed=seed),
        engines={} if real is not None else {name: m.engine(seed) for name, m in scenario.models.items()},
        apps=apps,
        pool_running=scenario.pool.running if scenario.pool is not None else None,
        duration=duration,
        real_models=dict(real.models) if real is not None else {},
        images=images,
    )


def _app(name: str, spec: AppSpec | None, slo_scale: float) -> App:
    if spec is None:
        return App(name)
    return App(name, slo=spec.slo.slo(0, slo_scale) if spec.slo else None,
               **({"weight": spec.weight} if "weight" in spec.model_fields_set else {}))


def _requests(scenario: Scenario, agent: Agent, model: str, times: np.ndarray, prompts: np.ndarray,
              outputs: np.ndarray, spec: AgentSpec | None, real: RealSpec | None, slo_scale: float) -> list[SimRequest]:
    """Requests of one agent, lengths cut as :func:`build` says."""
    max_tokens = spec.max_tokens if spec is not None else None
    if max_tokens is not None:
        outputs = np.minimum(outputs, max_tokens)
    if real is not None:
        prompts, outputs = np.minimum(prompts, real.max_prompt), np.minimum(outputs, real.max_output)
        max_tokens = min(max_tokens, real.max_output) if max_tokens is not None else None
    else:
        context = scenario.models[model].context
        outputs = np.minimum(outputs, context - 1)
        prompts = np.clip(np.minimum(prompts, context - (max_tokens if max_tokens is not None else outputs)), 1, None)
    timeout = spec.timeout * slo_scale if spec is not None and spec.timeout is not None else None
    return [
        SimRequest(float(t), agent, model, int(p), int(o), max_tokens, float(t) + timeout if timeout else None)
        for t, p, o in zip(times.tolist(), prompts.tolist(), outputs.tolist(), strict=True)
    ]


_TRACE_COLUMNS = ("timestamp", "app", "agent", "model", "input_tokens", "output_tokens")


def _trace(scenario: Scenario, apps: dict[str, App], agents: dict[tuple[str, str], tuple[Agent, AgentSpec | None]],
           rate: float, squeeze: float, duration: float, real: RealSpec | None, slo_scale: float,
           seed: int) -> list[SimRequest]:
    """The trace's rows as requests, at ``rate`` times their rate once the timeline is compressed by ``squeeze``."""
    rows = _trace_rows(scenario)
    if not rows:
        return []
    assert scenario.trace is not None
    t0 = min(r[0] for r in rows) if scenario.trace.rebase else 0.0
    keep = rate * squeeze  # beyond the compression: > 1 plays faster, ≤ 1 keeps each row with this probability
    rng = np.random.default_rng([seed, zlib.crc32(b"trace")])
    kept = rng.random(len(rows)) < min(keep, 1.0)
    speed = max(keep, 1.0)
    out = []
    for (t, app_name, agent_name, model, prompt, output, _), take in zip(rows, kept.tolist(), strict=True):
        at = (t - t0) / speed * squeeze
        if not take or at >= duration or at < 0:
            continue
        if app_name not in apps:
            apps[app_name] = _app(app_name, scenario.apps.get(app_name), slo_scale)
        if (app_name, agent_name) not in agents:
            agents[(app_name, agent_name)] = (Agent(agent_name, apps[app_name]), None)
        agent, spec = agents[(app_name, agent_name)]
        out.extend(_requests(scenario, agent, model, np.array([at]), np.array([prompt]), np.array([output]), spec,
                             real, slo_scale))
    return out


_TraceRow = tuple[float, str, str, str, int, int, int]
"""timestamp, app, agent, model, input_tokens, output_tokens and the row's line in the file."""


def _trace_rows(scenario: Scenario) -> list[_TraceRow]:
    """The rows of the scenario's trace (none without one), every row's model checked, whatever its time.

    Raises:
        ScenarioError: the trace cannot be read, or a row is malformed or names an unknown
            model; the message names the file and the row's line.
    """
    if scenario.trace is None:
        return []
    path = _resolve(scenario.trace.path, scenario._base)
    rows = _read_trace(str(path), _mtime(path))
    for _, _, _, model, _, _, line in rows:
        if model not in scenario.models:
            known = ", ".join(sorted(scenario.models))
            raise ScenarioError(f"{path}:{line}: unknown model {model!r}; known models: {known}", source=str(path))
    return rows


@functools.lru_cache(maxsize=8)
def _read_trace(path: str, mtime: int) -> list[_TraceRow]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in reader.fieldnames or []]
            missing = [c for c in _TRACE_COLUMNS if c not in header]
            if missing:
                raise ScenarioError(f"{path}:1: the trace lacks column(s) {', '.join(missing)}", source=path)
            rows = []
            for row in reader:
                row = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
                line = reader.line_num
                try:
                    t = float(row["timestamp"])
                    prompt, output = int(row["input_tokens"]), int(row["output_tokens"])
                except ValueError:
                    raise ScenarioError(f"{path}:{line}: timestamp must be a number and token counts integers",
                                        source=path) from None
                if (not math.isfinite(t) or not (1 <= prompt <= MAX_INT and 1 <= output <= MAX_INT)
                        or not row["app"] or not row["agent"]):
                    raise ScenarioError(f"{path}:{line}: a row needs a finite timestamp, an app, an agent and token "
                                        f"counts in [1, {MAX_INT}]", source=path)
                rows.append((t, row["app"], row["agent"], row["model"], prompt, output, line))
    except OSError as err:
        raise ScenarioError(f"cannot read trace {path}: {err.strerror or err}", source=path) from None
    except UnicodeDecodeError as err:
        raise ScenarioError(f"cannot read trace {path}: not UTF-8 text (byte {err.start})", source=path) from None
    except csv.Error as err:
        raise ScenarioError(f"cannot read trace {path}: {err}", source=path) from None
    return rows
