"""``fairagents bench run`` and ``bench compare``: a scenario under several policies, and what each delivered.

:func:`run_scenario` loads a scenario (a built-in name or a YAML file, see
:mod:`fairagents.bench.spec`), builds its workload once, and plays
it under every policy on the simulator (:func:`~fairagents.simulation.simulate`, fresh engines per policy)
or on the embedded real engines behind a live :class:`~fairagents.Arbiter` (open loop,
in real time: each request sent at its arrival time from its own task, cancelled at its
``cancel_at``). Both give the same records, so one set of metrics reads both
(:func:`policy_metrics`, keys in :data:`METRICS`). With ``out`` it writes, in
``out/<scenario>/``: ``<policy>.json`` (metrics and every request's timeline),
``summary.json``, ``summary.md``, and three plots (``service.png``, ``gap.png``,
``metrics.png``). :func:`compare` puts summary or per-run files side by side.

Examples:
    >>> from fairagents.bench.suite import METRICS
    >>> METRICS[:3], len(METRICS)
    (('requests', 'finished', 'cancelled'), 19)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import json
import math
import os
import platform
import random
import re
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fairagents._logging import get_logger
from fairagents.runtime.arbiter import Arbiter
from fairagents.bench.plots import write_plots
from fairagents.engines.base import capabilities
from fairagents.bench.policies import _met, esg, goodput, safi, slo_attainment
from fairagents.errors import BadInputError, EngineError, InvalidParameterError, OverloadedError
from fairagents.metrics import RequestRecord, exfairs_jain_index, jain_index, percentile
from fairagents.request import Outcome, Request
from fairagents.simulation import SimResult, simulate
from fairagents.stats import Ledger

if TYPE_CHECKING:
    from fairagents.bench.spec import Built, Scenario
    from fairagents.engines.base import Engine

__all__ = [
    "METRICS", "compare", "compare_markdown", "policy_metrics", "render", "render_compare", "run_scenario",
    "summary_markdown",
]

log = get_logger("fairagents.bench.suite")

#: The metrics of one policy's run, in the order tables show them (stable keys of the JSON output).
METRICS: tuple[str, ...] = (
    "requests", "finished", "cancelled", "throughput_tokens_per_s", "slo_attainment", "slo_violation_rate",
    "goodput", "ttft_p50", "ttft_p99", "tpot_p99", "e2e_mean", "jain", "jain_safi", "jain_exfairs", "max_gap",
    "gap_over_2u", "esg", "sim_seconds", "wall_seconds",
)

# (metric, column header, format) of the tables; the console shows the ones marked True.
_COLUMNS: tuple[tuple[str, str, str, bool], ...] = (
    ("requests", "requests", "{:.0f}", False), ("finished", "finished", "{:.0f}", True),
    ("cancelled", "cancelled", "{:.0f}", False), ("slo_attainment", "SLO met", "{:.1%}", True),
    ("goodput", "goodput", "{:.1%}", True), ("ttft_p50", "TTFT p50 (s)", "{:.2f}", False),
    ("ttft_p99", "TTFT p99 (s)", "{:.2f}", True), ("tpot_p99", "TPOT p99 (s)", "{:.3f}", True),
    ("e2e_mean", "e2e mean (s)", "{:.2f}", False), ("throughput_tokens_per_s", "tok/s", "{:,.0f}", True),
    ("jain", "Jain", "{:.3f}", True), ("jain_safi", "Jain (SAFI)", "{:.3f}", True),
    ("jain_exfairs", "Jain (ExFairS)", "{:.3f}", False), ("gap_over_2u", "gap / 2U", "{:.2f}", True),
    ("esg", "ESG", "{:.3f}", True),
)
_TEXT_PROMPT = "a red square on a blue field"


# -- metrics ---------------------------------------------------------------------------------------------------------


def policy_metrics(result: SimResult, *, duration: float, wall_seconds: float = 0.0) -> dict[str, float | int | None]:
    """The flat metrics of one run, keyed by :data:`METRICS` (``None`` where a value is undefined).

    ``duration`` is the scenario's seconds of arrivals: ``jain`` counts the service delivered
    until then. Definitions are in the benchmarks guide; each reuses the existing metric.
    A metric over SLOs counts only the requests that had the SLO it checks, so it is
    ``None`` when none had (``slo_attainment``, ``slo_violation_rate``, ``goodput``, ``esg``).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.bench.suite import METRICS, policy_metrics
        >>> from fairagents.simulation import Workload, simulate
        >>> a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
        >>> work = Workload().burst(a, "m", n=4, prompt=8, output=4).burst(b, "m", n=4, prompt=8, output=4)
        >>> row = policy_metrics(simulate(work, "vtc", {"m": fa.engines.SimEngine(fa.ModelProfile(4096, 1))}),
        ...                      duration=1.0)
        >>> tuple(row) == METRICS, row["finished"], row["jain"]
        (True, 8, 1.0)
    """
    records = result.records
    finished = [r for r in records if r.outcome is Outcome.FINISHED]
    ttfts = [r.ttft for r in records if r.ttft is not None]
    tpots = [r.tpot for r in records if r.tpot is not None]
    end = max((r.finished for r in records), default=0.0)
    shares = safi(result).values()
    gap = result.max_app_gap()
    attained = slo_attainment(records)
    row: dict[str, float | int | None] = {
        "requests": len(records),
        "finished": len(finished),
        "cancelled": sum(r.outcome is Outcome.CANCELLED for r in records),
        "throughput_tokens_per_s": sum(r.output_tokens for r in records) / end if end > 0 else math.nan,
        "slo_attainment": attained,
        "slo_violation_rate": 1.0 - attained,
        "goodput": goodput(records),
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p99": percentile(ttfts, 99),
        "tpot_p99": percentile(tpots, 99),
        "e2e_mean": sum(r.e2e for r in finished) / len(finished) if finished else math.nan,
        "jain": result.jain(until=duration),
        "jain_safi": jain_index(shares),
        "jain_exfairs": exfairs_jain_index(shares),
        "max_gap": gap,
        "gap_over_2u": gap / (2 * result.bound) if result.bound > 0 else math.nan,
        "esg": esg(records),
        "sim_seconds": end,
        "wall_seconds": wall_seconds,
    }
    return {k: v if isinstance(v, int) or math.isfinite(v) else None for k, v in row.items()}  # JSON has no NaN


# -- running ---------------------------------------------------------------------------------------------------------


def run_scenario(
    source: str | os.PathLike[str] | Scenario,
    policies: Sequence[str] | None = None,
    *,
    engine: Literal["sim", "real"] = "sim",
    seed: int | None = None,
    scale: float = 1.0,
    out: str | os.PathLike[str] | None = None,
    progress: bool = True,
    real_engines: Mapping[str, Engine] | None = None,
) -> dict[str, Any]:
    """Run a scenario under each policy; return (and with ``out``, write) what each delivered.

    Args:
        source: a built-in scenario name, a YAML file, or a loaded scenario.
        policies: policy names (default: the scenario's ``policies``, else every built-in).
        engine: ``"sim"`` (the simulator, deterministic for a seed) or ``"real"``: the
            embedded engines the scenario's models map to (one per kind, started once,
            shared by the policies), each policy behind its own arbiter, in real time.
        seed: the scenario's seed unless given.
        scale: load multiplier handed to :func:`~fairagents.bench.spec.build`.
        out: a folder; the files go to ``out/<scenario>/`` (see the module docstring).
        progress: show a progress bar on stderr.
        real_engines: with ``engine="real"``, the engines to play each kind (``"text"``,
            ``"vision"``, ``"image"``) on instead of the embedded ones; started and stopped here.

    Returns:
        ``{"scenario", "engine", "seed", "scale", "machine", "policies": {policy: metrics}}``.

    Raises:
        InvalidParameterError: an unknown policy or engine, or a scale ≤ 0
            (:class:`~fairagents.bench.spec.ScenarioError`: an unknown or invalid scenario).

    Examples:
        >>> from fairagents.bench.spec import load_scenario
        >>> from fairagents.bench.suite import run_scenario
        >>> short = load_scenario("vtc-overload").model_copy(update={"duration": 20.0})
        >>> result = run_scenario(short, ["fcfs", "vtc"], progress=False)
        >>> rows = result["policies"]
        >>> rows["vtc"]["gap_over_2u"] < 1 < rows["fcfs"]["max_gap"] / rows["vtc"]["max_gap"]
        True
        >>> run_scenario("vtc-overload", ["nope"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: unknown policy 'nope'; choose from adaptive, duet, ...
    """
    from fairagents.policies import POLICIES

    if engine not in ("sim", "real"):
        raise InvalidParameterError(f"engine must be 'sim' or 'real', got {engine!r}")
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
        raise InvalidParameterError(f"scale must be a finite number > 0, got {scale!r}")
    for name in policies or ():
        if name not in POLICIES:
            raise InvalidParameterError(f"unknown policy {name!r}; choose from {', '.join(sorted(POLICIES))}")
    from fairagents.bench import spec

    scenario = source if isinstance(source, spec.Scenario) else spec.load_scenario(source)
    names = list(policies or scenario.policies or sorted(POLICIES))
    if len(set(names)) != len(names):
        raise InvalidParameterError(f"a policy is named twice in {names}")

    first = spec.build(scenario, engine=engine, seed=seed, scale=scale)  # one workload, played by every policy
    seed = scenario.seed if seed is None else seed
    with _progress(progress) as bar:
        if engine == "sim":
            runs = _run_sim(first, seed, names, bar)
        else:
            runs = _in_own_loop(_run_real(first, names, bar, real_engines))
    summary = {
        "scenario": scenario.name, "engine": engine, "seed": seed, "scale": scale,
        "machine": _machine(),
        "policies": {name: policy_metrics(result, duration=first.duration, wall_seconds=wall)
                     for name, (result, wall) in runs.items()},
    }
    if out is not None:
        command = _command(source, scenario.name, names, engine, summary["seed"], scale, out)
        _write(Path(out) / _safe(scenario.name), scenario, summary, {n: r for n, (r, _) in runs.items()}, command)
    return summary


@contextlib.contextmanager
def _progress(show: bool) -> Iterator[Progress | None]:
    if not show:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        yield bar


def _run_sim(built: Built, seed: int, names: list[str], bar: Progress | None) -> dict[str, tuple[SimResult, float]]:
    tasks = {name: bar.add_task(f"{name} (simulator)", total=1) for name in names} if bar else {}
    runs = {}
    for i, name in enumerate(names):
        # fresh engines for every policy, seeded as build() seeds them
        engines = built.engines if i == 0 else {m: model.engine(seed) for m, model in built.scenario.models.items()}
        started = time.perf_counter()
        result = simulate(built.workload, name, engines, apps=built.apps or None, pool_running=built.pool_running)
        runs[name] = (result, time.perf_counter() - started)
        if bar:
            bar.advance(tasks[name])
    return runs


def _in_own_loop(coroutine: Any) -> Any:
    """Run ``coroutine`` to the end in a new event loop (on a helper thread if one runs here already)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fairagents-bench") as thread:
        return thread.submit(asyncio.run, coroutine).result()


async def _run_real(built: Built, names: list[str], bar: Progress | None,
                    given: Mapping[str, Engine] | None) -> dict[str, tuple[SimResult, float]]:
    from fairagents.engines import embedded_pool

    kinds = sorted(set(built.real_models.values()))
    missing = [kind for kind in kinds if given is not None and kind not in given]
    if missing:
        raise InvalidParameterError(f"no engine given for the scenario's {', '.join(missing)} model(s)")
    pool = given if given is not None else embedded_pool()
    engines = {kind: pool[kind] for kind in kinds}
    tasks = {name: bar.add_task(f"{name} (real engines)", total=len(built.workload)) for name in names} if bar else {}
    try:
        await _together(e.start() for e in engines.values())
        runs = {}
        for i, name in enumerate(names):
            advance = (lambda task=tasks[name]: bar.advance(task)) if bar else (lambda: None)
            started = time.perf_counter()
            result = await _play(built, name, engines, i, advance)
            runs[name] = (result, time.perf_counter() - started)
        return runs
    finally:
        await asyncio.gather(*(e.stop() for e in engines.values()), return_exceptions=True)


async def _together(coroutines: Iterable[Coroutine[Any, Any, Any]]) -> None:
    """Run the coroutines as tasks of one group: the first to fail cancels the others, and its error is raised."""
    try:
        async with asyncio.TaskGroup() as group:
            for coroutine in coroutines:
                group.create_task(coroutine)
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None


_QUEUED: contextvars.ContextVar[list[str]] = contextvars.ContextVar("fairagents_bench_queued")
"""In a sender's task: the id of the request the arbiter queued for it (empty until then)."""


def _bench_arbiter(*args: Any, **kwargs: Any) -> Arbiter:
    """An arbiter that keeps every record and charge, and tells each sender whether its request was queued.

    A queued request reaches the ledger however it ends; a sender whose request was not
    queued (refused, or given up before it was) records it itself.
    """
    arbiter = Arbiter(*args, **kwargs)
    arbiter.runner.ledger = Ledger(keep=sys.maxsize, clock=arbiter.clock)  # the metrics read every record and charge of the run

    def queued(request: Request) -> None:
        ids = _QUEUED.get(None)
        if ids is not None:
            ids.append(request.id)

    arbiter.runner.submitted.append(queued)
    return arbiter


async def _play(built: Built, policy: str, engines: Mapping[str, Engine], run: int, advance: Callable[[], None]
                ) -> SimResult:
    """One policy on started real engines: every request from its own task at its arrival time.

    Every request of the workload has one record: the ledger's, or the one its sender made
    for a request that was never queued.
    """
    origin = time.monotonic()

    def clock() -> float:  # seconds since the run started, as the simulator counts
        return time.monotonic() - origin

    arbiter = _bench_arbiter(policy, pool_in_flight=built.pool_running, clock=clock)
    for model, kind in built.real_models.items():
        arbiter.add_model(model, engines[kind])
    apps, agents = {}, {}
    for item in built.workload.requests:
        who = item.agent
        if who.key not in agents:
            arbiter.app(who.app.name, who.app.weight, who.app.slo).agent(who.name, who.weight, who.slo)
            apps[who.app.name], agents[who.key] = who.app, who
    unqueued: list[RequestRecord] = []
    await arbiter.start()
    origin = time.monotonic()  # the run's clock starts once the arbiter is up
    try:
        await _together(_send(arbiter, i, item, built.real_models[item.model], _images(built, item), engines, run,
                              clock, unqueued, advance) for i, item in enumerate(built.workload.requests))
    finally:
        await arbiter.close(stop_engines=False)
    if unqueued:
        log.warning("fairagents.bench.unqueued", policy=policy, requests=len(unqueued),
                    failed=sum(r.outcome is Outcome.FAILED for r in unqueued))
    records = list(arbiter.ledger.records) + unqueued
    assert len(records) == len(built.workload), f"{len(records)} records of {len(built.workload)} requests"
    return SimResult(
        policy=arbiter.policy.name, records=records, charges=list(arbiter.ledger.charges), apps=apps, agents=agents,
        cost=arbiter.cost, bound=arbiter.dispatcher.bound(), end=max((r.finished for r in records), default=0.0),
        idle_with_backlog=0,
    )


def _images(built: Built, item: Any) -> int:
    """Images the request carries to a vision model: its agent's, as built (an undeclared agent: one)."""
    return built.images.get((item.agent.app.name, item.agent.name), 1)


async def _send(arbiter: Any, i: int, item: Any, kind: str, images: int, engines: Mapping[str, Any], run: int,
                clock: Callable[[], float], unqueued: list[RequestRecord], advance: Callable[[], None]) -> None:
    """Send one request at its arrival time as its agent; give up at its ``cancel_at``.

    On a vision model its message holds ``images`` image parts before the text (0: text only).
    A request the arbiter never queued — refused (bad input, a full queue, its model down),
    or given up while its images were being prepared — has no ledger record: it is added
    to ``unqueued``, cancelled if its ``cancel_at`` has passed, else failed.
    """
    from fairagents.engines.base import Prompt

    queued: list[str] = []
    _QUEUED.set(queued)  # this task's own context: the arbiter notes the request it queues for it
    gave_up = False
    await asyncio.sleep(max(0.0, item.at - clock()))
    engine = engines[kind]
    try:
        limit = min(engine.max_model_len or 2**31, capabilities(engine).token_capacity or 2**31)
        output = min(item.output_tokens, max(1, limit // 4)) if kind != "image" else item.output_tokens
        prompt_len = max(1, min(item.prompt_tokens, limit - output - 1))
        if kind == "text":  # random ids, other for every request and policy: no prefix-cache hits between them
            rng = random.Random(run * 1_000_003 + i)
            vocab = capabilities(engine).vocab_size or 1000
            ids = tuple(rng.randrange(3, vocab) for _ in range(prompt_len))  # 0-2: special tokens in most vocabularies
            call = arbiter.complete(item.model, Prompt(token_ids=ids), agent=item.agent, max_tokens=output,
                                    ignore_eos=True, arrival=item.at)
        elif kind == "vision":
            text = " ".join(["word"] * min(prompt_len, max(1, limit // 4)))
            image = {"type": "image", "image": _tiny_png()}
            content = [*[image] * images, {"type": "text", "text": text}]
            call = arbiter.chat(item.model, [{"role": "user", "content": content}], agent=item.agent,
                                max_tokens=output, ignore_eos=True)
        else:  # image generation: output tokens are latent tokens (patches × denoising steps)
            per_step = engine.latent_tokens(engine.default_size, 1, 1)
            steps = max(1, min(engine.max_steps, round(item.output_tokens / per_step)))
            call = arbiter.generate_image(item.model, _TEXT_PROMPT, agent=item.agent, steps=steps)
        if item.cancel_at is None:
            await call
        else:
            try:
                async with asyncio.timeout(max(0.0, item.cancel_at - clock())):
                    await call
            except TimeoutError:
                gave_up = True
    except (EngineError, BadInputError, OverloadedError):
        pass  # queued, the ledger has it as failed; else it is recorded below
    finally:
        advance()
    if not queued:
        now = clock()
        gave_up = gave_up or (item.cancel_at is not None and now >= item.cancel_at)
        outcome = Outcome.CANCELLED if gave_up else Outcome.FAILED
        unqueued.append(RequestRecord(f"unqueued-{i}", item.agent.app.name, item.agent.name, item.model, item.at,
                                      None, None, now, item.prompt_tokens, 0, outcome, item.agent.effective_slo))


@functools.cache
def _tiny_png() -> bytes:
    from PIL import Image

    from fairagents.images import to_png

    return to_png(Image.new("RGB", (64, 64), (200, 40, 40)))


def _machine() -> dict[str, Any]:
    from fairagents import __version__

    return {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "fairagents": __version__}


def _command(source: Any, name: str, policies: list[str], engine: str, seed: int, scale: float, out: Any) -> str:
    where = name if not isinstance(source, str | os.PathLike) else os.fspath(source)
    return (f"fairagents bench run {where} --policies {','.join(policies)} --engine {engine} --seed {seed} "
            f"--scale {scale:g} --out {os.fspath(out)}")


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name) or "scenario"


# -- writing ---------------------------------------------------------------------------------------------------------


def _timeline(r: RequestRecord) -> dict[str, Any]:
    slo = None if r.slo is None else {"ttft": r.slo.ttft, "tpot": r.slo.tpot, "e2e": r.slo.e2e}
    return {"id": r.id, "app": r.app, "agent": r.agent, "model": r.model, "arrival": r.arrival,
            "dispatched": r.dispatched, "first_token": r.first_token, "finished": r.finished,
            "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens, "outcome": r.outcome.value,
            "slo": slo, "slo_met": None if slo is None else _met(r)}


def _write(folder: Path, scenario: Scenario, summary: dict[str, Any], results: Mapping[str, SimResult],
           command: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, result in results.items():
        head = {"scenario": summary["scenario"], "policy": name, "engine": summary["engine"], "seed": summary["seed"],
                "scale": summary["scale"], "metrics": summary["policies"][name]}
        timeline = [json.dumps(_timeline(r)) for r in sorted(result.records, key=lambda r: (r.arrival, r.id))]
        # one request a line: a run of thousands of requests stays readable and diffable
        text = json.dumps(head, indent=2)[:-2] + ',\n  "requests": [' + ",".join(f"\n    {t}" for t in timeline)
        (folder / f"{name}.json").write_text(text + "\n  ]\n}\n")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (folder / "summary.md").write_text(summary_markdown(summary, description=scenario.description, command=command))
    write_plots(folder, summary, results)


def summary_markdown(summary: Mapping[str, Any], *, description: str = "", command: str | None = None) -> str:
    """A run's summary as markdown: a table with a row per policy, and the command that regenerates it.

    Examples:
        >>> from fairagents.bench.suite import summary_markdown
        >>> md = summary_markdown({"scenario": "s", "engine": "sim", "seed": 0, "scale": 1.0, "machine": {},
        ...                        "policies": {"fcfs": {"finished": 3}}}, command="fairagents bench run s")
        >>> md.splitlines()[0], "| fcfs | — | 3 |" in md
        ('# Scenario `s`: simulator', True)
    """
    m = summary.get("machine") or {}
    where = "simulator" if summary["engine"] == "sim" else "real engines"
    lines = [f"# Scenario `{summary['scenario']}`: {where}", ""]
    if description:
        lines += [description.strip(), ""]
    lines += [f"Seed {summary['seed']}, scale {summary['scale']:g}; fairagents {m.get('fairagents', '?')}, "
              f"Python {m.get('python', '?')} on {m.get('platform', '?')} ({m.get('cpu_count', '?')} CPUs).", ""]
    lines += _markdown_table(["policy"], [([name], row) for name, row in summary["policies"].items()])
    lines += ["", "Metrics as defined in the guide *Running benchmarks and writing scenarios* "
                  "(`fairagents bench run`); —: undefined (no request had the SLO the metric checks, say)."]
    if command:
        lines += ["", "Regenerate with:", "", "```bash", command, "```"]
    return "\n".join(lines) + "\n"


def _markdown_table(keys: list[str], rows: list[tuple[list[str], Mapping[str, Any]]]) -> list[str]:
    headers = keys + [header for _, header, _, _ in _COLUMNS]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(["---"] * len(keys) + ["---:"] * len(_COLUMNS)) + " |"]
    for labels, row in rows:
        out.append("| " + " | ".join(labels + [_cell(row.get(k), fmt) for k, _, fmt, _ in _COLUMNS]) + " |")
    return out


def _cell(value: Any, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)  # undefined: no request had the SLO it measures, say


# -- reading and comparing -------------------------------------------------------------------------------------------


def compare(paths: Sequence[str | os.PathLike[str]]) -> dict[str, Any]:
    """Summary (``summary.json``) or per-run (``<policy>.json``) files side by side: a row per file × policy.

    Returns ``{"metrics": [...], "rows": [{"file", "scenario", "engine", "seed", "scale", "policy", "metrics"}]}``.

    Raises:
        InvalidParameterError: a file that is missing, not JSON, or neither kind of file.

    Examples:
        >>> from fairagents.bench.suite import compare
        >>> compare(["missing.json"])
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: cannot read missing.json: no such file
    """
    rows = []
    for path in paths:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise InvalidParameterError(f"cannot read {path}: no such file") from None
        except (OSError, ValueError) as err:
            raise InvalidParameterError(f"cannot read {path}: {err}") from None
        if isinstance(data, dict) and isinstance(data.get("policies"), dict):
            runs = list(data["policies"].items())
        elif isinstance(data, dict) and isinstance(data.get("metrics"), dict) and "policy" in data:
            runs = [(data["policy"], data["metrics"])]
        else:
            raise InvalidParameterError(f"{path} is neither a summary nor a run of fairagents bench run")
        for policy, metrics in runs:
            rows.append({"file": str(path), "scenario": data.get("scenario"), "engine": data.get("engine"),
                         "seed": data.get("seed"), "scale": data.get("scale"), "policy": policy,
                         "metrics": {k: metrics.get(k) for k in METRICS}})
    return {"metrics": list(METRICS), "rows": rows}


def compare_markdown(result: Mapping[str, Any]) -> str:
    """:func:`compare`'s rows as a markdown table.

    Examples:
        >>> from fairagents.bench.suite import compare_markdown
        >>> row = {"file": "a.json", "scenario": "s", "engine": "sim", "policy": "hmfs", "metrics": {"jain": 1.0}}
        >>> compare_markdown({"rows": [row]}).splitlines()[2].startswith("| a.json | s | sim | hmfs |")
        True
    """
    rows = [([r["file"], str(r["scenario"]), str(r["engine"]), r["policy"]], r["metrics"]) for r in result["rows"]]
    return "\n".join(_markdown_table(["file", "scenario", "engine", "policy"], rows)) + "\n"


def render(result: Mapping[str, Any]) -> list[Table]:
    """:func:`run_scenario`'s result for the console: a row per policy.

    Examples:
        >>> from fairagents.bench.suite import render
        >>> result = {"scenario": "s", "engine": "sim", "seed": 0, "scale": 1.0, "policies": {"fcfs": {"jain": 0.5}}}
        >>> [table.row_count for table in render(result)]
        [1]
    """
    where = "simulator" if result["engine"] == "sim" else "real engines"
    table = Table(title=f"{result['scenario']} on the {where} (seed {result['seed']}, scale {result['scale']:g})")
    table.add_column("policy")
    _add_metric_columns(table)
    for name, row in result["policies"].items():
        table.add_row(name, *(_cell(row.get(k), fmt) for k, _, fmt, shown in _COLUMNS if shown))
    table.caption = ("SLO met: finished within every SLO, of the requests with one; gap / 2U: largest service gap of "
                     "backlogged apps over 2U; —: undefined (no request had the SLO it checks)")
    return [table]


def render_compare(result: Mapping[str, Any]) -> Table:
    """:func:`compare`'s rows for the console.

    Examples:
        >>> from fairagents.bench.suite import render_compare
        >>> row = {"file": "a.json", "scenario": "s", "engine": "sim", "policy": "hmfs", "metrics": {}}
        >>> render_compare({"rows": [row, row]}).row_count
        2
    """
    table = Table(title="fairagents bench compare")
    for column in ("file", "scenario", "engine", "policy"):
        table.add_column(column)
    _add_metric_columns(table)
    for r in result["rows"]:
        table.add_row(r["file"], str(r["scenario"]), str(r["engine"]), r["policy"],
                      *(_cell(r["metrics"].get(k), fmt) for k, _, fmt, shown in _COLUMNS if shown))
    return table


def _add_metric_columns(table: Table) -> None:
    for _, header, _, shown in _COLUMNS:
        if shown:
            table.add_column(header, justify="right")
