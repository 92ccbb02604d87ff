"""Benchmarks behind ``fairagents bench …``: they measure, print a table, and emit JSON.

Examples:
    >>> from fairagents.bench import BENCHMARKS
    >>> sorted(BENCHMARKS)
    ['modality', 'overhead', 'scheduler', 'server']
"""

from __future__ import annotations

from fairagents.bench import modality, overhead, scheduler, server

__all__ = ["BENCHMARKS"]

#: Benchmark name → module with ``run(**options) -> dict`` and ``render(result) -> rich table``.
BENCHMARKS = {"modality": modality, "overhead": overhead, "scheduler": scheduler, "server": server}
