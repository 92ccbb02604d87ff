"""Engines that run model requests.

:class:`Engine` is the interface the arbiter drives; :class:`EngineBase` gives the
optional capabilities their defaults. :class:`SimEngine` is a discrete-event simulator
of a continuous-batching engine for benchmarks and tests (it serves no one).

The real engines live in their own modules, imported on use (they pull in vLLM, torch
and diffusers): :mod:`fairagents.engines.vllm`, :mod:`~fairagents.engines.vision` and
:mod:`~fairagents.engines.diffusion` (in this process, on a thread each:
:mod:`~fairagents.engines.threaded`), and :mod:`~fairagents.engines.remote` (remote
replicas); :func:`embedded_pool` builds the first three. ``from fairagents.engines
import VLLMEngine`` (or ``VisionEngine``, ``DiffusionEngine``, ``OpenAIEngine``) imports
its module then, not before.

Examples:
    >>> from fairagents.engines import VLLMEngine   # its module is imported now
    >>> VLLMEngine.__module__
    'fairagents.engines.vllm'
"""

from __future__ import annotations

from typing import Any

from fairagents.engines.base import Delta, Engine, EngineBase, GenerationParams, ImageEngine, Prompt, capabilities
from fairagents.engines.sim import SimEngine, SimProgress

__all__ = ["Delta", "Engine", "EngineBase", "GenerationParams", "ImageEngine", "Prompt", "SimEngine", "SimProgress",
           "capabilities", "embedded_pool"]

_LAZY = {
    "VLLMEngine": "fairagents.engines.vllm",
    "VisionEngine": "fairagents.engines.vision",
    "DiffusionEngine": "fairagents.engines.diffusion",
    "OpenAIEngine": "fairagents.engines.remote",
}


def __getattr__(name: str) -> Any:
    """The real engines, imported on first use (they pull in vLLM, torch, diffusers or openai)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fairagents.engines' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def embedded_pool(text_model: str | None = None) -> dict[str, Engine]:
    """A text, a vision and an image engine on the embedded tiny models, not yet started.

    Sized for a small machine: 64 MiB of KV cache each for the vLLM engines, images up
    to 256 px in 8 denoising steps by default. ``text_model`` serves another text model
    (a folder or a name) in place of the embedded one. The engines build their models
    on first start.

    Examples:
        >>> import fairagents as fa
        >>> pool = fa.engines.embedded_pool()   # nothing loads until the arbiter starts them
        >>> {name: engine.modality.value for name, engine in pool.items()}
        {'text': 'text', 'vision': 'vision', 'image': 'image'}
    """
    from fairagents.engines.diffusion import DiffusionEngine
    from fairagents.engines.vision import VisionEngine
    from fairagents.engines.vllm import VLLMEngine

    return {
        "text": VLLMEngine(text_model, kv_cache_bytes=64 * 2**20, max_model_len=1024 if text_model is None else None),
        "vision": VisionEngine(kv_cache_bytes=64 * 2**20, max_model_len=1024, max_num_seqs=8),
        "image": DiffusionEngine(max_size=256, default_steps=8),
    }
