"""The ``fairagents`` command line.

Every command and option has its help (``fairagents --help``, ``fairagents bench
scheduler --help``). The command is quiet by default: it keeps vLLM, transformers,
diffusers and torch to their errors (:func:`configure_output`); ``-v``/``--verbose``,
before or after the command, shows their logs and fairagents' own events again. A
command whose optional packages are missing says which extra installs them and exits
with code 2.

Examples:
    >>> from fairagents.cli import build_parser
    >>> build_parser().parse_args(["bench", "scheduler", "--json"]).json
    True
    >>> build_parser().parse_args(["serve", "--verbose"]).verbose, build_parser().parse_args(["-v", "serve"]).verbose
    (True, True)
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["COMMAND_EXTRAS", "EXTRAS", "QUIET_ENV", "build_parser", "configure_output", "main", "missing_extra"]

#: ``bench`` subcommands of :mod:`fairagents.bench.suite` (the others are in ``fairagents.bench.BENCHMARKS``).
SUITE_COMMANDS = ("run", "compare", "scenarios", "schema")

#: The packages each optional extra installs (``pip install 'fairagents[EXTRA]'``), by import name. ``cpu``
#: stands for either engine extra: ``gpu`` installs the same packages with CUDA.
EXTRAS = {
    "server": ("fastapi", "uvicorn", "httptools", "prometheus_client", "yaml"),
    "bench": ("rich", "matplotlib", "numpy", "yaml"),
    "cpu": ("vllm", "torch", "transformers", "diffusers", "PIL"),
    "redis": ("redis",),
}

#: The extras each command may use, in the order a missing package is put down to them; the first is
#: checked before the command starts.
COMMAND_EXTRAS = {
    "serve": ("server", "cpu", "redis"),
    "demo": ("bench", "cpu"),
    "bench": ("bench", "server", "cpu", "redis"),
    "models": ("cpu",),
}

#: Environment set (where unset) by a quiet command before vLLM, torch, transformers or diffusers is
#: imported: only their errors are logged, and their progress bars are off.
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TORCH_LOGS": "-all",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "DIFFUSERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}

#: Modules whose ``UserWarning``s a quiet command hides.
_NOISY_MODULES = r"(vllm|torch|transformers|diffusers|huggingface_hub|tokenizers)(\.|$)"

_VERBOSE_HELP = ("show fairagents' events and the logs and warnings of vLLM, transformers, diffusers and torch "
                 "(hidden by default)")

#: ``-v``/``--verbose`` after a command: unset there, it leaves the value given before the command.
_VERBOSE = argparse.ArgumentParser(add_help=False)
_VERBOSE.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=_VERBOSE_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fairagents``.

    Examples:
        >>> from fairagents.cli import build_parser
        >>> args = build_parser().parse_args(["demo", "--simulated", "--devices", "separate"])
        >>> args.command, args.simulated, args.devices, args.verbose
        ('demo', True, 'separate', False)
    """
    from fairagents import __version__
    from fairagents.policies import POLICIES

    parser = argparse.ArgumentParser(
        prog="fairagents", description="Fair model serving for multi-agent, multi-modal apps.",
        epilog="Run 'fairagents COMMAND --help' for a command's options.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help=f"{_VERBOSE_HELP}; also accepted after the command")
    parser.add_argument("--version", action="version", version=f"fairagents {__version__}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = _command(
        commands, "demo", "run several apps on a shared real pool and show who got what",
        "Run three apps on a shared real text, vision and image pool (the embedded tiny models) under each "
        "policy, print who got what, and write a plot. --simulated plays the same load on the simulator "
        "instead.")
    demo.add_argument("--policy", action="append", help="policy to compare (repeatable; default: fcfs and hmfs)")
    demo.add_argument("--seconds", type=float, default=12.0, help="load duration per policy")
    demo.add_argument("--out", default="fairagents-demo.png", help="where to write the plot")
    demo.add_argument("--model", help="model folder or name to serve as the text model instead of the embedded one")
    demo.add_argument("--devices", choices=("one", "separate"), default="one",
                      help="the models' devices: one device, as here (one CPU), or one each, as on three GPUs")
    demo.add_argument("--simulated", action="store_true",
                      help="play the same load on the simulator (engines timed as on a 2-core CPU) instead")

    serve = _command(
        commands, "serve", "serve the pool over an OpenAI-compatible HTTP API with a live fairness view",
        "Serve the pool over an OpenAI-compatible HTTP API (chat, completions, images, models), with "
        "per-app API keys, /health, /metrics, /v1/fairness and a live /dashboard. Without --config: the "
        "embedded tiny model as 'chat', keys off, on 127.0.0.1:8000.")
    serve.add_argument("--config", help="a .toml or .yaml configuration (default: the embedded model, keys off)")
    serve.add_argument("--host", help="address to listen on (overrides server.host)")
    serve.add_argument("--port", type=int, help="port to listen on (overrides server.port)")
    serve.add_argument("--policy", metavar="NAME|MODULE:CLASS",
                       help=f"scheduling policy: {', '.join(sorted(POLICIES))}, or one of your own as module:Class "
                            "(overrides policy)")
    serve.add_argument("--model", help="model folder or Hugging Face name to serve as 'chat' instead of the embedded "
                                       "one (with --config: the path of its one model)")

    models = _command(commands, "models", "manage the embedded default models")
    model_commands = models.add_subparsers(dest="models_command", required=True, metavar="COMMAND")
    _command(model_commands, "build", "build the embedded models now (otherwise built on first use)",
             "Build the embedded tiny models (text, vision, image) under $FAIRAGENTS_HOME and print where.")

    bench = _command(commands, "bench", "run a benchmark or a scenario; prints tables (or JSON)",
                     "Run a benchmark or a scenario and print its tables (or JSON with --json).")
    benches = bench.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    json_help = "print JSON instead of tables"

    sched = _command(benches, "scheduler", "scheduling decisions per second by number of agents")
    sched.add_argument("--agents", type=int, nargs="+", default=[10, 1_000, 10_000], help="agent counts to measure")
    sched.add_argument("--policies", nargs="+", default=["hmfs", "vtc"], choices=sorted(POLICIES),
                       help="policies to measure")
    sched.add_argument("--decisions", type=int, default=50_000, help="decisions timed per run")
    sched.add_argument("--repeats", type=int, default=5, help="runs per cell; the best is reported")
    sched.add_argument("--json", action="store_true", help=json_help)

    over = _command(benches, "overhead",
                   "arbiter vs direct engine throughput and TTFT; in-flight limit sweep; KV pressure")
    over.add_argument("--model", help="model to serve instead of the embedded tiny model")
    over.add_argument("--callers", type=int, default=32, help="concurrent callers of the overhead load")
    over.add_argument("--per-caller", type=int, default=3, help="requests each caller sends back to back")
    over.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    over.add_argument("--rounds", type=int, default=2, help="times each path runs, alternating")
    over.add_argument("--sweep", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64], help="in-flight limits to sweep")
    over.add_argument("--kv-seconds", type=float, default=20.0, help="length of each KV pressure run")
    over.add_argument("--json", action="store_true", help=json_help)

    srv = _command(benches, "server", "HTTP server vs in-process API: requests/s and TTFT on one engine")
    srv.add_argument("--model", help="model to serve instead of the embedded tiny model")
    srv.add_argument("--callers", type=int, default=32, help="concurrent callers, spread over four apps")
    srv.add_argument("--per-caller", type=int, default=4, help="streaming requests each caller sends back to back")
    srv.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    srv.add_argument("--rounds", type=int, default=2, help="times each path runs, alternating")
    srv.add_argument("--json", action="store_true", help=json_help)

    sst = _command(benches, "scheduler-step",
                   "what FairScheduler adds to a vLLM engine step, against vLLM's own scheduler (no model)")
    sst.add_argument("--running", type=int, nargs="+", default=[100, 1_000, 4_000], help="requests in the batch")
    sst.add_argument("--clients", type=int, nargs="+", default=[10, 1_000, 10_000], help="apps the requests belong to")
    sst.add_argument("--steps", type=int, default=20, help="steps per timed run")
    sst.add_argument("--rounds", type=int, default=5, help="alternating runs per scheduler; the best is reported")
    sst.add_argument("--policy", default="hmfs", choices=sorted(POLICIES), help="the fair scheduler's policy")
    sst.add_argument("--json", action="store_true", help=json_help)

    svv = _command(benches, "serve-vs-vllm",
                   "fairagents serve vs vllm serve (and with FairScheduler), on vLLM's own benchmark client")
    svv.add_argument("--model", help="model to serve instead of the embedded tiny model")
    svv.add_argument("--concurrencies", type=int, nargs="+", default=[64, 256], help="client concurrencies to measure")
    svv.add_argument("--num-prompts", type=int, default=400, help="requests per concurrency")
    svv.add_argument("--input-len", type=int, default=64, help="prompt tokens of each request")
    svv.add_argument("--output-len", type=int, default=128, help="output tokens of each request (EOS ignored)")
    svv.add_argument("--kv-cache-bytes", type=int, default=256 * 2**20, help="KV cache of every server")
    svv.add_argument("--max-model-len", type=int, default=1024, help="context length of every server")
    svv.add_argument("--servers", nargs="+", choices=["vllm", "vllm-fair", "fairagents"],
                     default=["vllm", "vllm-fair", "fairagents"], help="servers to run, in order")
    svv.add_argument("--json", action="store_true", help=json_help)

    pol = _command(benches, "policies", "every policy on one mixed-SLO overload scenario (simulator)")
    pol.add_argument("--policies", nargs="+", help="policies to run (default: every built-in)")
    pol.add_argument("--seconds", type=float, default=60.0, help="virtual seconds of traffic")
    pol.add_argument("--seed", type=int, default=0, help="seed of the scenario")
    pol.add_argument("--json", action="store_true", help=json_help)

    adm = _command(benches, "admission", "worst-case reservations vs Statera admission (simulator)")
    adm.add_argument("--policies", nargs="+", choices=sorted(POLICIES),
                     help="policies to run (default: fcfs hmfs edf sjf)")
    adm.add_argument("--seconds", type=float, default=60.0, help="virtual seconds of traffic")
    adm.add_argument("--seed", type=int, default=0, help="seed of the scenario")
    adm.add_argument("--json", action="store_true", help=json_help)

    simc = _command(benches, "simulator", "the simulator's cost by clients and load (ExFairS VI's workload shape)")
    simc.add_argument("--clients", type=int, nargs="+", default=[5, 10, 20, 50, 100], help="client counts to measure")
    simc.add_argument("--rates", type=float, nargs="+", default=[2.0, 4.0, 8.0], help="requests per client per minute")
    simc.add_argument("--policy", default="hmfs", choices=sorted(POLICIES), help="policy to simulate")
    simc.add_argument("--minutes", type=int, default=10, help="simulated minutes")
    simc.add_argument("--seed", type=int, default=0, help="seed of the workload")
    simc.add_argument("--repeats", type=int, default=3, help="runs per cell; the fastest is reported")
    simc.add_argument("--json", action="store_true", help=json_help)

    scl = _command(benches, "scale", "several arbiters over one pool: weighted shares through Redis, overhead; "
                                     "and at scale in the simulator (64 replicas, 10,000 agents, 1-8 doors)")
    scl.add_argument("--redis", help="Redis URL for the real part (default: start a redis-server on loopback)")
    scl.add_argument("--no-real", dest="real", action="store_false", help="skip the part on this machine")
    scl.add_argument("--no-simulated", dest="simulated", action="store_false", help="skip the simulated part")
    scl.add_argument("--seconds", type=float, default=10.0, help="seconds measured per real mode")
    scl.add_argument("--callers", type=int, default=16, help="requests each app keeps in flight (real part)")
    scl.add_argument("--slots", type=int, default=8,
                     help="requests the engine takes at once, over every door (real part)")
    scl.add_argument("--max-tokens", type=int, default=16, help="output tokens per request (real part)")
    scl.add_argument("--doors", type=int, nargs="+", default=[1, 2, 4, 8], help="arbiters (simulated part)")
    scl.add_argument("--replicas", type=int, default=64, help="model replicas (simulated part)")
    scl.add_argument("--slots-per-replica", type=int, default=16,
                     help="requests a replica runs at once (simulated part)")
    scl.add_argument("--agents", type=int, default=10_000, help="agents (simulated part)")
    scl.add_argument("--apps", type=int, default=100, help="apps the agents belong to (simulated part)")
    scl.add_argument("--sim-seconds", type=float, default=3.0, help="simulated seconds per row")
    scl.add_argument("--interval", type=float, default=0.02, help="seconds between syncs")
    scl.add_argument("--delay", type=float, default=0.001, help="a sync's simulated round trip, seconds")
    scl.add_argument("--seed", type=int, default=0, help="seed of the simulated workload")
    scl.add_argument("--json", action="store_true", help=json_help)

    vsch = _command(benches, "vllm-scheduler",
                   "fair inside vLLM (FairScheduler) vs vLLM's own vs the arbiter, under KV pressure")
    vsch.add_argument("--seconds", type=float, default=15.0, help="seconds per mode and round")
    vsch.add_argument("--rounds", type=int, default=2, help="times each mode runs, alternating")
    vsch.add_argument("--flood-callers", type=int, default=30, help="callers of the flooding app")
    vsch.add_argument("--victim-callers", type=int, default=3, help="callers of the other app")
    vsch.add_argument("--json", action="store_true", help=json_help)

    iso = _command(benches, "isolation",
                  "a well-behaved app's latency while another app floods, with and without a per-app cap")
    iso.add_argument("--model", help="model to serve instead of the embedded tiny model")
    iso.add_argument("--seconds", type=float, default=10.0, help="length of each victim run")
    iso.add_argument("--victim-tokens", type=int, default=16, help="output tokens of each victim request")
    iso.add_argument("--flood-clients", type=int, default=60, help="concurrent clients of the flooding app")
    iso.add_argument("--flood-tokens", type=int, default=512, help="output tokens of each flood request")
    iso.add_argument("--flood-queue", type=int, default=8, help="the flooding app's max_queued")
    iso.add_argument("--share", type=float, default=0.5, help="max_in_flight_share of the capped runs")
    iso.add_argument("--in-flight", type=int, help="the model's in-flight limit (default: the engine's batch capacity)")
    iso.add_argument("--json", action="store_true", help=json_help)

    moda = _command(benches, "modality",
                   "text TTFT under image preprocessing load (pool vs inline); cross-modal shares of a pool")
    moda.add_argument("--images", type=int, default=40, help="image requests sent during the text load")
    moda.add_argument("--image-side", type=int, default=1400, help="side of each (square) image, pixels")
    moda.add_argument("--text-requests", type=int, default=20, help="text requests, one every 50 ms")
    moda.add_argument("--text-tokens", type=int, default=4, help="output tokens of each text request")
    moda.add_argument("--seconds", type=float, default=30.0, help="length of each cross-modal run")
    moda.add_argument("--pool", type=int, default=3, help="in-flight slots the three models share")
    moda.add_argument("--json", action="store_true", help=json_help)

    flows = _command(benches, "workflows",
                    "runs of agent workflows (chains, fan-out/join, mixed, weighted, flood, shared node; open-loop "
                    "streams and bursts of runs): run completion time, runs/s, app shares (simulator, or --real)")
    flows.add_argument("--scenarios", nargs="+", choices=["chains", "fanout", "mixed", "weighted", "flood", "shared",
                                                          "stream", "bursts"],
                       help="scenarios to run (default: all)")
    flows.add_argument("--policies", nargs="+", metavar="NAME",
                       help="policies beside fcfs, hmfs and the default policy, space- or comma-separated "
                            "(default: every built-in policy named for runs)")
    flows.add_argument("--seconds", type=float, help="seconds users start runs (default 60 simulated, 20 real)")
    flows.add_argument("--users", type=float,
                       help="factor on every scenario's users and arrival rates (default 1 simulated, 0.25 real)")
    flows.add_argument("--seed", type=int, default=0, help="seed of the runs")
    flows.add_argument("--real", action="store_true",
                       help="the embedded engine through the arbiter, in real time, instead of the simulator")
    flows.add_argument("--out", help="also write the JSON result to this file")
    flows.add_argument("--json", action="store_true", help=json_help)

    _add_suite_commands(benches)
    return parser


def _command(group: argparse._SubParsersAction, name: str, summary: str,
             description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand: its one-line summary, its description (the summary unless given) and ``--verbose``."""
    return group.add_parser(name, help=summary, description=description or f"{summary[0].upper()}{summary[1:]}.",
                            parents=[_VERBOSE])


def _add_suite_commands(benches: argparse._SubParsersAction) -> None:
    """``bench run``, ``compare``, ``scenarios`` and ``schema``: scenarios from files, not one fixed benchmark."""
    run = _command(
        benches, "run", "run a scenario under several policies (simulator or real engines); JSON, markdown and plots",
        "Run a scenario under several policies and report SLO, latency and fairness metrics per policy. "
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
    compare = _command(benches, "compare", "put bench run results (summary or per-run JSON) side by side")
    compare.add_argument("files", nargs="+", help="summary.json or <policy>.json files")
    compare.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _command(benches, "scenarios", "list the built-in scenarios")
    _command(benches, "schema", "print the JSON schema of scenario files")


def _console() -> Console:
    """Where tables go: stdout, as wide as the terminal, or as wide as each table needs when not a terminal.

    Piped to a file or another program, rich would fit tables into 80 columns and cut
    cells short (``scen…``); there each table prints at its natural width instead.
    """
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else _UNBOUNDED_WIDTH)


#: The width of the console when stdout is not a terminal: wider than any table, which prints at its natural width.
_UNBOUNDED_WIDTH = 10_000


def _suite(args: argparse.Namespace) -> int:
    """``bench run``, ``compare``, ``scenarios``, ``schema``; bad input is a message and exit code 2."""
    from fairagents.bench import spec, suite
    from fairagents.errors import BadInputError

    console = _console()
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


def _bench(args: argparse.Namespace) -> int:
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
        console = _console()
        for table in [tables] if isinstance(tables, Table) else tables:
            console.print(table)
    return 0


def configure_output(verbose: bool = False) -> None:
    """Decide, as the application, what reaches stderr: fairagents' events and third-party logs.

    fairagents' own events (structlog) go to stderr from ``WARNING`` up, or ``INFO`` up
    when ``verbose``. Quiet (the default), the environment of :data:`QUIET_ENV` is set
    where unset, so it takes effect only if called before vLLM, torch, transformers or
    diffusers is imported: their logs keep to errors (vLLM's notes such as
    ``torch.set_num_threads`` being skipped, diffusers' T5 truncation notice) and their
    progress bars are off; and ``FutureWarning``, ``DeprecationWarning`` and those
    packages' ``UserWarning`` are ignored. Verbose, they keep their own defaults.
    vLLM logs to stderr either way, leaving stdout to tables and JSON (a program that
    uses the library and configures nothing gets no vLLM log handler at all).

    Examples:
        >>> from fairagents.cli import QUIET_ENV
        >>> QUIET_ENV["VLLM_LOGGING_LEVEL"], QUIET_ENV["DIFFUSERS_VERBOSITY"]
        ('ERROR', 'error')
    """
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")  # the library leaves vLLM's logging off; the command has it
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO if verbose else logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    if verbose:
        return
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    level = os.environ["VLLM_LOGGING_LEVEL"].upper()
    if level in logging.getLevelNamesMapping():  # vLLM applies it when an engine is configured; before, this does
        logging.getLogger("vllm").setLevel(level)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=_NOISY_MODULES)


def missing_extra(command: str, module: str | None) -> str | None:
    """The extra of ``command`` that installs the missing ``module``, or ``None`` if none does.

    Examples:
        >>> from fairagents.cli import missing_extra
        >>> missing_extra("serve", "fastapi.responses"), missing_extra("serve", "yaml"), missing_extra("bench", "yaml")
        ('server', 'server', 'bench')
        >>> missing_extra("demo", "vllm"), missing_extra("serve", "numpy")
        ('cpu', None)
    """
    top = (module or "").partition(".")[0]
    return next((extra for extra in COMMAND_EXTRAS.get(command, ()) if top in EXTRAS[extra]), None)


def _install_hint(extra: str) -> str:
    if extra == "cpu":
        return "pip install 'fairagents[cpu]' (or 'fairagents[gpu]' with CUDA)"
    return f"pip install 'fairagents[{extra}]'"


def _check_extra(command: str) -> None:
    """Raise ``ModuleNotFoundError`` for the first missing package of the extra ``command`` needs up front."""
    needs = COMMAND_EXTRAS.get(command, ())
    if not needs or needs[0] == "cpu":  # the engine extra is needed only by the engines a command builds
        return
    for module in EXTRAS[needs[0]]:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)


def _run(args: argparse.Namespace) -> int:
    _check_extra(args.command)
    if args.command == "demo":
        from fairagents import demo

        if args.simulated:
            demo.simulated_main(_console(), policies=args.policy or ["fcfs", "hmfs"], seconds=args.seconds,
                                out=args.out, layout=args.devices)
        else:
            demo.main(_console(), policies=args.policy or ["fcfs", "hmfs"], seconds=args.seconds, out=args.out,
                      model=args.model, layout=args.devices)
        return 0
    if args.command == "serve":
        from fairagents.errors import BadInputError
        from fairagents.server import main as serve

        try:
            status = serve(args.config, host=args.host, port=args.port, policy=args.policy, model=args.model)
        except BadInputError as err:  # a bad configuration file or option
            print(f"fairagents serve: {err}", file=sys.stderr)
            return 2
        # The server has stopped and the process exits next. vLLM unfreezes the heap when its
        # engines stop; frozen again, the interpreter's exit skips collecting the millions of
        # objects torch and vLLM hold (seconds on a CPU) only to free them as the process ends.
        gc.freeze()
        return status
    if args.command == "models":
        from fairagents.models import ensure_default_models

        for kind, path in ensure_default_models().items():
            print(f"{kind}: {path}")
        return 0
    if args.command == "bench":
        return _suite(args) if args.benchmark in SUITE_COMMANDS else _bench(args)
    raise AssertionError(f"unhandled command {args}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fairagents`` command: its exit code.

    A command whose extra is missing, or a model that cannot load, prints one line naming
    it and returns 2.
    """
    args = build_parser().parse_args(argv)
    configure_output(args.verbose)
    try:
        return _run(args)
    except ModuleNotFoundError as err:
        extra = missing_extra(args.command, err.name)
        if extra is None:
            raise
        name = "'cpu' or 'gpu'" if extra == "cpu" else repr(extra)
        package = (err.name or "").partition(".")[0]
        print(f"fairagents {args.command}: needs the {name} extra ({package} is not installed): "
              f"{_install_hint(extra)}", file=sys.stderr)
        return 2
    except Exception as err:
        from fairagents.errors import ModelLoadError

        if not isinstance(err, ModelLoadError):
            raise
        print(f"fairagents {args.command}: {err}", file=sys.stderr)  # a model path or name that cannot load
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
