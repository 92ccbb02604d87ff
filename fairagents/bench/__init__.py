"""Benchmarks behind ``fairagents bench …``: they measure, print a table, and emit JSON.

Examples:
    >>> from fairagents.bench import BENCHMARKS
    >>> sorted(BENCHMARKS)
    ['admission', 'isolation', 'modality', 'overhead', 'policies', 'scale', 'scheduler', 'scheduler-step', 'serve-vs-vllm', 'server', 'simulator', 'vllm-scheduler', 'workflows']
"""

from __future__ import annotations

from fairagents.bench import (
    admission,
    isolation,
    modality,
    overhead,
    policies,
    scale,
    scheduler,
    scheduler_step,
    serve_vs_vllm,
    server,
    simulator,
    vllm_scheduler,
    workflows,
)

__all__ = ["BENCHMARKS"]

#: Benchmark name → module with ``run(**options) -> dict`` and ``render(result) -> rich table``.
BENCHMARKS = {"admission": admission, "isolation": isolation, "modality": modality, "overhead": overhead, "policies": policies,
              "scale": scale, "scheduler": scheduler, "scheduler-step": scheduler_step, "serve-vs-vllm": serve_vs_vllm, "server": server, "simulator": simulator, "vllm-scheduler": vllm_scheduler,
              "workflows": workflows}
