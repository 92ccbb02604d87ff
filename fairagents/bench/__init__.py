"""Benchmarks behind ``fairagents bench …``: they measure, print a table, and emit JSON.

Examples:
    >>> from fairagents.bench import BENCHMARKS
    >>> sorted(BENCHMARKS)
    ['overhead', 'scheduler']
"""

from __future__ import annotations

from fairagents.bench import overhead, scheduler

__all__ = ["BENCHMARKS"]

#: Benchmark name → module with ``run(**options) -> dict`` and ``render(result) -> rich table``.
BENCHMARKS = {"overhead": overhead, "scheduler": scheduler}
