"""The check of what a request tells the fair scheduler: its ``fairagents_*`` arguments.

Over ``vllm serve`` a request names its app, its agent and (without a weights file)
their weights in ``vllm_xargs``, which vLLM hands to the engine as
``SamplingParams.extra_args``. The scheduler runs in vLLM's engine process, past the
point where a request can still be refused with a 400, so the check runs at the door:
vLLM's API server calls each custom logits processor's ``validate_params`` on every
request before it reaches the engine, and :class:`FairArgsValidator` is such a
processor that only checks (it leaves logits alone). Serve with
``--logits-processors fairagents.vllm:FairArgsValidator`` next to ``--scheduler-cls``;
a request it refuses is answered 400 with the reason, and nothing is queued or charged.

What passes :func:`check_args`: ``fairagents_app`` and ``fairagents_agent`` are non-empty
strings of at most :data:`MAX_NAME` characters; ``fairagents_app_weight`` and
``fairagents_agent_weight`` are finite numbers > 0 (not strings, not booleans);
``fairagents_run`` is a run id (:func:`~fairagents.identity.check_run`: 1 to 128 letters,
digits and ``_.:@/+=-``); no other ``fairagents_*`` key (a misspelt one would otherwise be ignored in silence).
Keys without the prefix are other processors' business.

Examples:
    >>> from fairagents.vllm.args import check_args
    >>> check_args({"fairagents_app": "search", "fairagents_app_weight": 2, "seed_hint": 1})
    >>> check_args({"fairagents_app_weight": -3})
    Traceback (most recent call last):
    ...
    fairagents.errors.InvalidParameterError: vllm_xargs: fairagents_app_weight must be a finite number in [0.001, 1000], got -3
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as V2LogitsProcessor

from fairagents.constants import METADATA_AGENT, METADATA_APP, XARG_AGENT_WEIGHT, XARG_APP_WEIGHT, XARG_RUN
from fairagents.errors import InvalidParameterError
from fairagents.identity import check_run
from fairagents.identity import check_weight as _check_weight

__all__ = ["MAX_NAME", "FairArgsValidator", "check_args", "check_weight"]

#: Longest app or agent name a request may send (names become metric labels and counters).
MAX_NAME = 128
_NAMES = (METADATA_APP, METADATA_AGENT)
_WEIGHTS = (XARG_APP_WEIGHT, XARG_AGENT_WEIGHT)
_PREFIX = "fairagents_"


def check_weight(value: Any, what: str) -> float:
    """``value`` as a weight: a finite number in :data:`~fairagents.identity.WEIGHT_RANGE` (a boolean is not one).

    Examples:
        >>> from fairagents.vllm.args import check_weight
        >>> check_weight(2, "app 'a'")
        2.0
    """
    return _check_weight(value, what)


def check_args(extra_args: Mapping[str, Any] | None) -> None:
    """Raise :class:`~fairagents.errors.InvalidParameterError` (a ``ValueError``) for bad ``fairagents_*`` arguments.

    Examples:
        >>> from fairagents.vllm.args import check_args
        >>> check_args(None)
        >>> check_args({"fairagents_agent": 7})
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: vllm_xargs: fairagents_agent must be a non-empty string of at most 128 characters, got 7
        >>> check_args({"fairagents_run": "digest 7"})
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: vllm_xargs: fairagents_run: a run id is 1 to 128 letters, digits and _.:@/+=-, got 'digest 7'
    """
    for key, value in (extra_args or {}).items():
        if not key.startswith(_PREFIX):
            continue
        if key in _NAMES:
            if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
                shown = value if not isinstance(value, str) else f"{len(value)} characters" if value else "''"
                raise InvalidParameterError(
                    f"vllm_xargs: {key} must be a non-empty string of at most {MAX_NAME} characters, got {shown}")
        elif key in _WEIGHTS:
            check_weight(value, f"vllm_xargs: {key}")
        elif key == XARG_RUN:
            try:
                check_run(value)
            except InvalidParameterError as err:
                raise InvalidParameterError(f"vllm_xargs: {key}: {err}") from None
        else:
            known = ", ".join((*_NAMES, *_WEIGHTS, XARG_RUN))
            raise InvalidParameterError(f"vllm_xargs: unknown key {key!r} (fairagents reads {known})")


class FairArgsValidator(V1LogitsProcessor, V2LogitsProcessor):
    """A logits processor that only checks requests' ``fairagents_*`` arguments, in vLLM's API server.

    Name it with ``--logits-processors fairagents.vllm:FairArgsValidator`` (or
    ``EngineArgs(logits_processors=[FairArgsValidator])``): vLLM then calls
    :meth:`validate_params` on each request before queueing it and answers one that
    fails with 400. In the engine it changes no logits and asks for no work per step.
    It implements both of vLLM's logits-processor interfaces (the V1 model runner's,
    used on a CPU, and the V2 runner's), so one flag serves either.

    Examples:
        >>> from vllm import SamplingParams
        >>> from fairagents.vllm import FairArgsValidator
        >>> FairArgsValidator.validate_params(SamplingParams(extra_args={"fairagents_app": "search"}))
        >>> FairArgsValidator.validate_params(SamplingParams(extra_args={"fairagents_app_weight": "heavy"}))
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: vllm_xargs: fairagents_app_weight must be a finite number in [0.001, 1000], got 'heavy'
    """

    def __init__(self, vllm_config: Any, *args: Any) -> None:
        pass  # no state: V1 passes (vllm_config, device, is_pin_memory), V2 (vllm_config, req_states)

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        check_args(sampling_params.extra_args)

    @classmethod
    def configured(cls, vllm_config: Any) -> bool:
        """Whether an engine's configuration names this class among its logits processors."""
        named = vllm_config.model_config.logits_processors or ()
        return any(p is cls or (isinstance(p, type) and issubclass(p, cls)) or str(p).endswith(":FairArgsValidator")
                   for p in named)

    def is_argmax_invariant(self) -> bool:
        return True  # V1: skipped for greedy requests

    def update_state(self, batch_update: Any) -> None:
        pass

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        return False  # V2: modifies no request's logits

    def apply(self, logits: Any, ctx: Any = None) -> Any:
        return logits
