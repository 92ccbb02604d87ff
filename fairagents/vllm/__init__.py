"""fairagents for vLLM users who do not use the SDK: a fair scheduler for vLLM's own engine loop.

Hand vLLM :class:`FairScheduler` (:mod:`fairagents.vllm.scheduler`) and
:class:`FairArgsValidator`, which refuses requests with invalid ``fairagents_*``
arguments with a 400 (:mod:`fairagents.vllm.args`)::

    vllm serve MODEL --scheduler-cls fairagents.vllm.FairScheduler \\
        --logits-processors fairagents.vllm:FairArgsValidator

and clients name themselves per request with ``extra_body={"vllm_xargs":
{"fairagents_app": "search", "fairagents_agent": "planner"}}``. The scheduler's
figures join vLLM's ``/metrics`` (:mod:`fairagents.vllm.metrics`). The guide
"Fair vLLM without the SDK" shows the whole set-up.

vLLM's API server imports this package for :class:`FairArgsValidator` alone, so the
scheduler's names load on first use: the server never pulls in vLLM's scheduler.

Examples:
    >>> from vllm.engine.arg_utils import EngineArgs
    >>> from fairagents.vllm import FairArgsValidator, FairScheduler
    >>> args = EngineArgs(model="some/model", scheduler_cls=FairScheduler, logits_processors=[FairArgsValidator])
    >>> args.scheduler_cls is FairScheduler
    True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fairagents.vllm.args import CONFIG_ENV, FairArgsValidator, Weights, identity

if TYPE_CHECKING:
    from fairagents.vllm.scheduler import FairScheduler

__all__ = ["CONFIG_ENV", "FairArgsValidator", "FairScheduler", "Weights", "identity"]

_SCHEDULER = frozenset({"FairScheduler"})


def __getattr__(name: str) -> Any:
    """The scheduler's names, imported on first use."""
    if name not in _SCHEDULER:
        raise AttributeError(f"module 'fairagents.vllm' has no attribute {name!r}")
    return getattr(importlib.import_module("fairagents.vllm.scheduler"), name)
