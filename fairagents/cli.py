"""The ``fairagents`` command line.

Examples:
    >>> from fairagents.cli import build_parser
    >>> build_parser().parse_args(["bench", "scheduler", "--json"]).json
    True
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from collections.abc import Sequence

import structlog
from rich.console import Console

__all__ = ["build_parser", "main"]

#: ``bench`` subcommands of :mod:`fairagents.bench.suite` (the others are in ``fairagents.bench.BENCHMARKS``).
SUITE_COMMANDS = ("run", "compare", "scenarios", "schema")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fairagents``."""
    from fairagents import __version__
    from fairagents.policies import POLICIES

    parser = argparse.ArgumentParser(prog="fairagents", description="Fair model serving for multi-agent apps.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine and arbiter events to stderr")
    parser.add_argument("--version", action="version", version=f"fairagents {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser(
        "demo", help="run several apps on a shared real engine and show who got what",
        description="Run several apps on a shared real engine (the embedded tiny model by default) under each "
                    "policy, print who got what, and write a plot. --simulated runs a three-model scenario on the "
                    "simulator instead.")
    demo.add_argument("--policy", action="append", help="policy to compare (repeatable; default: fcfs and hmfs)")
    demo.add_argument("--seconds", type=float, default=12.0, help="load duration per policy (real engines)")
    demo.add_argument("--out", default="fairagents-demo.png", help="where to write the plot (real engines)")
    demo.add_argument("--model", help="model folder or name to serve instead of the embedded tiny model")
    demo.add_argument("--simulated", action="store_true", help="run the three-model scenario on the simulator instead")
    demo.add_argument("--seed", type=int, default=0, help="seed of the simulated scenario")

    serve = commands.add_parser(
        "serve", help="serve the pool over an OpenAI-compatible HTTP API with a live fairness view",
        description="Serve the pool over an OpenAI-compatible HTTP API (chat, completions, images, models), with "
                    "per-app API keys, /health, /metrics, /v1/fairness and a live /dashboard. Without --config: the "
                    "embedded tiny model as 'chat', keys off, on 127.0.0.1:8000.")
    serve.add_argument("--config", help="a .toml or .yaml configuration (default: the embedded model, keys off)")
    serve.add_argument("--host", help="overrides server.host")
    serve.add_argument("--port", type=int, help="overrides server.port")

    models = commands.add_parser("models", help="the embedded default models")
    model_commands = models.add_subparsers(dest="models_command", required=True)
    model_commands.add_parser("build", help="build the embedded models now (otherwise built on first use)")

    bench = commands.add_parser("bench", help="run a benchmark; prints a table (or JSON)")
    benches = bench.add_subparsers(dest="benchmark", required=True)
    sched = benches.add_parser("scheduler", help="scheduling decisions per second by number of agents")
    sched.add_argument("--agents", type=int, nargs="+", default=[10, 1_000, 10_000])
    sched.add_argument("--policies", nargs="+", default=["hmfs", "vtc"], choices=sorted(POLICIES))
    sched.add_argument("--decisions", type=int, default=50_000, help="decisions timed per run")
    sched.add_argument("--repeats", type=int, default=5, help="runs per cell; the best is reported")
    sched.add_argument("--json", action="store_true", help="print JSON instead of a table")
    over = benches.add_parser("overhead", help="arbiter vs direct engine throughput and TTFT; in-flight limit sweep; KV pressure")
    over.add_argument("--model", help="model to serve instead of the embedded tiny model")
    over.add_argument("--callers", type=int, default=32)
    over.add_argument("--per-caller", type=int, default=3)
    over.add_argument("--max-tokens", type=int, default=64)
    over.add_argument("--rounds", type=int, default=2)
    over.add_argument("--sweep", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    over.add_argument("--kv-seconds", type=float, default=20.0, help="length of each KV pressure run")
    over.add_argument("--json", action="store_true", help="print JSON instead of tables")
    srv = benches.add_parser("server", help="HTTP server vs in-process API: requests/s and TTFT on one engine")
    srv.add_argument("--model", help="model to serve instead of the embedded tiny model")
    srv.add_argument("--callers", type=int, default=32)
    srv.add_argument("--per-caller", type=int, default=4)
    srv.add_argument("--max-tokens", type=int, default=64)
    srv.add_argument("--rounds", type=int, default=2)
    srv.add_argument("--json", action="store_true", help="print JSON instead of a table")
    pol = benches.add_parser("policies", help="every policy on one mixed-SLO overload scenario (simulator)")
    pol.add_argument("--policies", nargs="+", help="policies to run (default: every built-in)")
    pol.add_argument("--seconds", type=float, default=60.0, help="virtual seconds of traffic")
    pol.add_argument("--seed", type=int, default=0)
    pol.add_argument("--json", action="store_true", help="print JSON instead of a table")
    adm = benches.add_parser("admission", help="worst-case reservations vs Statera admission (simulator)")
    adm.add_argument("--policies", nargs="+", choices=sorted(POLICIES), help="policies to run (default: fcfs hmfs edf sjf)")
    adm.add_argument("--seconds", type=float, default=60.0, help="virtual seconds of traffic")
    adm.add_argument("--seed", type=int, default=0)
    adm.add_argument("--json", action="store_true", help="print JSON instead of a table")
    simc = benches.add_parser("simulator", help="the simulator's cost by clients and load (ExFairS VI's workload shape)")
    simc.add_argument("--clients", type=int, nargs="+", default=[5, 10, 20, 50, 100])
    simc.add_argument("--rates", type=float, nargs="+", default=[2.0, 4.0, 8.0], help="requests per client per minute")
    simc.add_argument("--policy", default="hmfs", choices=sorted(POLICIES))
    simc.add_argument("--minutes", type=int, default=10, help="simulated minutes")
    simc.add_argument("--seed", type=int, default=0)
    simc.add_argument("--repeats", type=int, default=3, help="runs per cell; the fastest is reported")
    simc.add_argument("--json", action="store_true", help="print JSON instead of tables")
    scl = benches.add_parser("scale", help="several arbiters over one pool: weighted shares through Redis, overhead; "
                                           "and at scale in the simulator (64 replicas, 10,000 agents, 1-8 doors)")
    scl.add_argument("--redis", help="Redis URL for the real part (default: start a redis-server on loopback)")
    scl.add_argument("--no-real", dest="real", action="store_false", help="skip the part on this machine")
    scl.add_argument("--no-simulated", dest="simulated", action="store_false", help="skip the simulated part")
    scl.add_argument("--seconds", type=float, default=10.0, help="seconds measured per real mode")
    scl.add_argument("--callers", type=int, default=16, help="requests each app keeps in flight (real part)")
    scl.add_argument("--slots", type=int, default=8, help="requests the engine takes at once, over every door (real part)")
    scl.add_argument("--max-tokens", type=int, default=16)
    scl.add_argument("--doors", type=int, nargs="+", default=[1, 2, 4, 8], help="arbiters (simulated part)")
    scl.add_argument("--replicas", type=int, default=64)
    scl.add_argument("--slots-per-replica", type=int, default=16)
    scl.add_argument("--agents", type=int, default=10_000)
    scl.add_argument("--apps", type=int, default=100)
    scl.add_argument("--sim-seconds", type=float, default=3.0, help="simulated seconds per row")
    scl.add_argument("--interval", type=float, default=0.005, help="seconds between syncs")
    scl.add_argument("--delay", type=float, default=0.001, help="a sync's simulated round trip, seconds")
    scl.add_argument("--seed", type=int, default=0)
    scl.add_argument("--json", action="store_true", help="print JSON instead of tables")
    vsch = benches.add_parser("vllm-scheduler", help="fair inside vLLM (FairScheduler) vs vLLM's own vs the arbiter, under KV pressure")
    vsch.add_argument("--seconds", type=float, default=15.0, help="seconds per mode and round")
    vsch.add_argument("--rounds", type=int, default=2)
    vsch.add_argument("--flood-callers", type=int, default=30)
    vsch.add_argument("--victim-callers", type=int, default=3)
    vsch.add_argument("--json", action="store_true", help="print JSON instead of tables")
    iso = benches.add_parser("isolation", help="a well-behaved app's latency while another app floods, with and without a per-app cap")
    iso.add_argument("--model", help="model to serve instead of the embedded tiny model")
    iso.add_argument("--seconds", type=float, default=10.0, help="length of each victim run")
    iso.add_argument("--victim-tokens", type=int, default=16)
    iso.add_argument("--flood-clients", type=int, default=60)
    iso.add_argument("--flood-tokens", type=int, default=512)
    iso.add_argument("--flood-queue", type=int, default=8, help="the flooding app's max_queued")
    iso.add_argument("--share", type=float, default=0.5, help="max_in_flight_share of the capped runs")
    iso.add_argument("--in-flight", type=int, help="the model's in-flight limit (default: the engine's batch capacity)")
    iso.add_argument("--json", action="store_true", help="print JSON instead of a table")
    moda = benches.add_parser(
        "modality", help="text TTFT under image preprocessing load (pool vs inline); cross-modal shares of a pool"
    )
    moda.add_argument("--images", type=int, default=40)
    moda.add_argument("--image-side", type=int, default=1400)
    moda.add_argument("--text-requests", type=int, default=20)
    moda.add_argument("--text-tokens", type=int, default=4)
    moda.add_argument("--seconds", type=float, default=30.0, help="length of each cross-modal run")
    moda.add_argument("--pool", type=int, default=3, help="in-flight slots the three models share")
    moda.add_argument("--json", action="store_true", help="print JSON instead of tables")
    _add_suite_commands(benches)
    return parser


def _add_suite_commands(benches: argparse._SubParsersAction) -> None:
    """``bench run``, ``compare``, ``scenarios`` and ``schema``: scenarios from files, not one fixed benchmark."""
    run = benches.add_parser(
        "run", help="run a scenario under several policies (simulator or real engines); JSON, markdown and plots",
        description="Run a scenario under several policies and report SLO, latency and fairness metrics per policy. "
                    "With --out, write per-run JSON timelines, summary.json, summary.md and PNG plots.")
    run.add_argument("scenario", help="a built-in scenario (fairagents bench scenarios) or a YAML file")
    run.add_argument("--policies", type=lambda text: [p for p in text.split(",") if p],
                     help="comma-separated policies (default: the scenario's, else every built-in)")
    run.add_argument("--engine", choices=["sim", "real"], default="sim",
                     help="the simulator (default) or the embedded real engines, in real time")
    run.add_argument("--seed", type=int, help="seed (default: the scenario's)")
    run.add_argument("--scale", type=float, default=1.0, help="load multiplier (default 1)")
    run.add_argument("--out", help="folder to write results to (in <out>/<scenario>/)")
    run.add_argument("--json", action="store_true", help='print {"<policy>": {metric: value}} instead of a table')
    compare = benches.add_parser("compare", help="put bench run results (summary or per-run JSON) side by side")
    compare.add_argument("files", nargs="+", help="summary.json or <policy>.json files")
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")
    benches.add_parser("scenarios", help="list the built-in scenarios")
    benches.add_parser("schema", help="print the JSON schema of scenario files")


def _suite(args: argparse.Namespace, console: Console) -> int:
    """``bench run``, ``compare``, ``scenarios``, ``schema``; bad input is a message and exit code 2."""
    from fairagents.bench import spec, suite
    from fairagents.errors import BadInputError

    try:
        if args.benchmark == "run":
            result = suite.run_scenario(args.scenario, args.policies, engine=args.engine, seed=args.seed,
                                        scale=args.scale, out=args.out)
            if args.json:
                sys.stdout.write(json.dumps(result["policies"], indent=2) + "\n")
            else:
                for table in suite.render(result):
                    console.print(table)
                if args.out:
                    console.print(f"results, summary and plots written under {args.out}")
        elif args.benchmark == "compare":
            compared = suite.compare(args.files)
            if args.json:
                sys.stdout.write(json.dumps(compared, indent=2) + "\n")
            else:
                console.print(suite.render_compare(compared))
        elif args.benchmark == "scenarios":
            from rich.table import Table

            table = Table(title="Built-in scenarios (fairagents bench run NAME)")
            table.add_column("name")
            table.add_column("description")
            for name, description in spec.builtin_scenarios().items():
                table.add_row(name, description.splitlines()[0] if description else "")
            console.print(table)
        else:
            sys.stdout.write(json.dumps(spec.scenario_json_schema(), indent=2) + "\n")
    except BadInputError as err:
        print(f"fairagents bench {args.benchmark}: {err}", file=sys.stderr)
        return 2
    return 0


def _bench(args: argparse.Namespace, console: Console) -> int:
    """Run the benchmark named on the command line with its options; print its tables, or JSON."""
    from rich.table import Table

    from fairagents.bench import BENCHMARKS

    module = BENCHMARKS[args.benchmark]
    options = {k: v for k, v in vars(args).items() if k not in {"command", "benchmark", "json", "verbose"}}
    result = module.run(**options)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        tables = module.render(result)
        for table in [tables] if isinstance(tables, Table) else tables:
            console.print(table)
    return 0


def _configure_logging(verbose: bool) -> None:
    """The CLI is an application: it, not the library, decides where logs go (stderr)."""
    level = logging.INFO if verbose else logging.WARNING
    os.environ.setdefault("VLLM_LOGGING_LEVEL", logging.getLevelName(level))
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # keep stdout for tables and JSON
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    if not verbose:
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fairagents`` command."""
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    console = Console(width=None if sys.stdout.isatty() else 110)
    if args.command == "demo":
        if args.simulated:
            from fairagents import scenarios

            scenarios.main(console, policies=args.policy or ["fcfs", "vtc", "hmfs"], seed=args.seed)
        else:
            from fairagents import demo

            demo.main(console, policies=args.policy or ["fcfs", "hmfs"], seconds=args.seconds, out=args.out, model=args.model)
        return 0
    if args.command == "serve":
        from fairagents.errors import BadInputError
        from fairagents.server import main as serve

        try:
            return serve(args.config, host=args.host, port=args.port)
        except BadInputError as err:  # a bad configuration file or option
            print(f"fairagents serve: {err}", file=sys.stderr)
            return 2
    if args.command == "models":
        from fairagents.models import ensure_default_models

        for kind, path in ensure_default_models().items():
            console.print(f"{kind}: {path}")
        return 0
    if args.command == "bench":
        return _suite(args, console) if args.benchmark in SUITE_COMMANDS else _bench(args, console)
    raise AssertionError(f"unhandled command {args}")


if __name__ == "__main__":
    raise SystemExit(main())
