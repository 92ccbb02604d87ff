"""fairagents for vLLM users who do not use the SDK: a fair scheduler for vLLM's own engine loop.

``fairagents.vllm.FairScheduler`` is the class to hand vLLM (it lives in
:mod:`fairagents.engines.fair_scheduler`), with ``FairArgsValidator``, which refuses
requests with invalid ``fairagents_*`` arguments with a 400
(:mod:`fairagents.engines.fair_args`)::

    vllm serve MODEL --scheduler-cls fairagents.vllm.FairScheduler \\
        --logits-processors fairagents.vllm:FairArgsValidator

and clients name themselves per request with ``extra_body={"vllm_xargs":
{"fairagents_app": "search", "fairagents_agent": "planner"}}``. The scheduler's
figures join vLLM's ``/metrics`` (:mod:`fairagents.engines.fair_metrics`). The guide
"Fair vLLM without the SDK" shows the whole set-up.

Examples:
    >>> from fairagents.vllm import FairScheduler
    >>> FairScheduler.__module__
    'fairagents.engines.fair_scheduler'
"""

from __future__ import annotations

from fairagents.engines.fair_args import FairArgsValidator
from fairagents.engines.fair_scheduler import CONFIG_ENV, FairScheduler, Weights, identity

__all__ = ["CONFIG_ENV", "FairArgsValidator", "FairScheduler", "Weights", "identity"]
