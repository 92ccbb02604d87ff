"""Engines that run model requests.

:class:`Engine` is the interface the arbiter drives. :class:`SimEngine` is a
discrete-event simulator of a continuous-batching engine for benchmarks and tests
(it serves no one).

Examples:
    >>> import fairagents as fa
    >>> fa.engines.SimEngine(fa.ModelProfile(d_model=64, n_layers=2)).max_running
    16
"""

from __future__ import annotations

from fairagents.engines.base import Delta, Engine, GenerationParams, ImageEngine, Prompt
from fairagents.engines.sim import SimEngine, SimProgress

__all__ = ["Delta", "Engine", "GenerationParams", "ImageEngine", "Prompt", "SimEngine", "SimProgress"]
