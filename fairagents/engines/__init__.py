"""Engines that run model requests.

For now: :class:`SimEngine`, a discrete-event simulator of a continuous-batching
engine for benchmarks and tests (it serves no one).

Example:
    >>> import fairagents as fa
    >>> fa.engines.SimEngine(fa.ModelProfile(d_model=64, n_layers=2)).max_running
    16
"""

from __future__ import annotations

from fairagents.engines.sim import SimEngine, SimProgress

__all__ = ["SimEngine", "SimProgress"]
