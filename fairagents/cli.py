"""The ``fairagents`` command line.

Example:
    >>> from fairagents.cli import build_parser
    >>> build_parser().parse_args(["bench", "scheduler", "--json"]).json
    True
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rich.console import Console

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fairagents``."""
    parser = argparse.ArgumentParser(prog="fairagents", description="Fair model serving for multi-agent apps.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run several apps on a shared pool and show who got what")
    demo.add_argument("--policy", action="append", help="policy to compare (repeatable; default: fcfs, vtc, hmfs)")
    demo.add_argument("--seed", type=int, default=0)

    bench = commands.add_parser("bench", help="run a benchmark; prints a table (or JSON)")
    benches = bench.add_subparsers(dest="benchmark", required=True)
    sched = benches.add_parser("scheduler", help="scheduling decisions per second by number of agents")
    sched.add_argument("--agents", type=int, nargs="+", default=[10, 1_000, 10_000])
    sched.add_argument("--policies", nargs="+", default=["hmfs", "vtc"], choices=["hmfs", "vtc"])
    sched.add_argument("--decisions", type=int, default=200_000, help="decisions timed per cell")
    sched.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fairagents`` command."""
    args = build_parser().parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 110)
    if args.command == "demo":
        from fairagents import demo

        demo.main(console, policies=args.policy or ["fcfs", "vtc", "hmfs"], seed=args.seed)
        return 0
    if args.command == "bench" and args.benchmark == "scheduler":
        from fairagents.bench import scheduler

        result = scheduler.run(agents=args.agents, policies=args.policies, decisions=args.decisions)
        if args.json:
            sys.stdout.write(json.dumps(result, indent=2) + "\n")
        else:
            console.print(scheduler.render(result))
        return 0
    raise AssertionError(f"unhandled command {args}")


if __name__ == "__main__":
    raise SystemExit(main())
