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

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as V2LogitsProcessor

from fairagents._logging import get_logger
from fairagents.constants import METADATA_AGENT, METADATA_APP, XARG_AGENT_WEIGHT, XARG_APP_WEIGHT, XARG_RUN
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent, App, check_run
from fairagents.identity import check_weight as _check_weight

__all__ = ["CONFIG_ENV", "MAX_NAME", "FairArgsValidator", "Weights", "check_args", "check_weight", "identity", "run_of"]

log = get_logger("fairagents.vllm.scheduler")  # the scheduler's: it reads a request's arguments as it arrives

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


# -- what the arguments mean: the client, its weights and its run ----------------------------

#: Environment variable naming the weights file (TOML or JSON) of :class:`~fairagents.vllm.scheduler.FairScheduler`.
CONFIG_ENV = "FAIRAGENTS_SCHEDULER_CONFIG"
_DEFAULT = "default"  # the app and agent of a request that names none


class Weights:
    """App and agent weights from a file: ``{"apps": {app: {"weight": w, "agents": {agent: w}}}}``.

    Examples:
        >>> from fairagents.vllm.args import Weights
        >>> w = Weights({"apps": {"search": {"weight": 2, "agents": {"planner": 3}}}})
        >>> w.app("search"), w.agent("search", "planner"), w.agent("search", "other"), w.app("x")
        (2.0, 3.0, 1.0, 1.0)
        >>> Weights({"apps": {"a": {"weight": 0}}})
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: weight of app 'a' must be a finite number in [0.001, 1000], got 0
    """

    def __init__(self, data: Mapping[str, Any]) -> None:
        apps = data.get("apps", {})
        if not isinstance(apps, Mapping) or set(data) - {"apps"}:
            raise InvalidParameterError('a weights file holds one table, "apps": {app: {"weight": ..., "agents": {...}}}')
        self._apps: dict[str, float] = {}
        self._agents: dict[tuple[str, str], float] = {}
        for name, spec in apps.items():
            if not isinstance(spec, Mapping) or set(spec) - {"weight", "agents"}:
                raise InvalidParameterError(f'app {name!r} of a weights file takes "weight" and "agents", got {spec!r}')
            self._apps[name] = check_weight(spec.get("weight", 1.0), f"weight of app {name!r}")
            for agent, w in (spec.get("agents") or {}).items():
                self._agents[(name, agent)] = check_weight(w, f"weight of agent {agent!r} of app {name!r}")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Weights:
        """Read a TOML (``.toml``) or JSON file."""
        text = Path(path).read_text()
        return cls(tomllib.loads(text) if str(path).endswith(".toml") else json.loads(text))

    def app(self, name: str) -> float:
        return self._apps.get(name, 1.0)

    def agent(self, app: str, name: str) -> float:
        return self._agents.get((app, name), 1.0)


def identity(extra_args: Mapping[str, Any] | None, weights: Weights | None = None) -> Agent:
    """The agent a request's ``extra_args`` name (app and agent ``default`` when absent).

    With ``weights`` (a weights file), weights come from it alone; without, from the
    ``fairagents_app_weight`` / ``fairagents_agent_weight`` arguments. Served with
    :class:`~fairagents.vllm.args.FairArgsValidator`, a request with invalid
    ones never gets here; without it, an invalid weight counts as 1.
    """
    args = extra_args or {}
    app = str(args.get(METADATA_APP) or _DEFAULT)
    name = str(args.get(METADATA_AGENT) or _DEFAULT)
    if weights is not None:
        return Agent(name, App(app, weight=weights.app(app)), weight=weights.agent(app, name))
    return Agent(name, App(app, weight=_arg_weight(args, XARG_APP_WEIGHT)), weight=_arg_weight(args, XARG_AGENT_WEIGHT))


def run_of(extra_args: Mapping[str, Any] | None) -> str | None:
    """The run a request's ``extra_args`` name (``fairagents_run``), or ``None``: the request is a run of its own.

    Served with :class:`~fairagents.vllm.args.FairArgsValidator`, a request with an
    invalid run never gets here; without it, an invalid run counts as none.

    Examples:
        >>> from fairagents.vllm.args import run_of
        >>> run_of({"fairagents_run": "digest-7"}), run_of(None)
        ('digest-7', None)
    """
    run = (extra_args or {}).get(XARG_RUN)
    if run is None:
        return None
    try:
        return check_run(run)
    except InvalidParameterError as err:
        log.warning("fairagents.vllm.bad_run", error=str(err))
        return None


def _arg_weight(args: Mapping[str, Any], key: str) -> float:
    if key not in args:
        return 1.0
    try:
        return check_weight(args[key], key)
    except InvalidParameterError as err:
        log.warning("fairagents.vllm.bad_weight", error=str(err))
        return 1.0
