"""The pool of models behind an arbiter: each model's engine and its admission limits.

A model the arbiter dispatches runs under two limits (see :mod:`fairagents.dispatcher`):
**in-flight**, the requests handed to its engine at once, and a **token budget**, the
KV tokens those requests may reserve. Unset, the in-flight limit is the engine's batch
capacity (``max_num_seqs``) and the token budget its KV capacity (``token_capacity``),
as the engine reports them once started. A model whose engine schedules by the pool's
policy itself (``VLLMEngine``'s default, ``scheduler="fair"``) is handed each request
at once: neither limit applies, and its batch capacity is its app shares' base.

Examples:
    >>> from fairagents.runtime.pool import Pool
    >>> from fairagents.testing import FakeEngine
    >>> pool = Pool(in_flight=None, token_budget="engine")
    >>> m = pool.add("chat", FakeEngine(token_capacity=512), in_flight=4)
    >>> pool.limit(m), pool.budget(m)
    (4, 512)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import tenacity

from fairagents.engines.base import Engine, capabilities
from fairagents.errors import InvalidParameterError, ModelLoadError, ProtocolError, UnknownModelError
from fairagents.policies import Policy
from fairagents.policies.pooled import PoolPolicy
from fairagents.policies.devices import LOCAL, Devices, policy_factory

__all__ = ["DEFAULT_IN_FLIGHT", "Pool", "PoolModel", "Restart", "TokenBudget", "default_device", "schedules_fairly"]

#: Requests a model runs at once when neither the call nor the engine says (``fairagents bench overhead``).
DEFAULT_IN_FLIGHT = 32

#: A token budget: the engine's reported KV capacity (``"engine"``), a number of tokens, or none.
TokenBudget = Literal["engine"] | int | None


@dataclass(frozen=True)
class Restart:
    """How a model whose engine died is brought back.

    The arbiter waits ``backoff`` seconds (the engine's memory is freed meanwhile),
    stops the dead engine and starts it again; a failed start is retried after a
    wait that doubles each time, up to ``max_backoff``, for ``attempts`` starts in
    all. If none succeeds the model stays down until
    :meth:`~fairagents.Arbiter.restart_model` is called.

    Examples:
        >>> import fairagents as fa
        >>> fa.Restart().attempts, fa.Restart(backoff=0.5).backoff
        (5, 0.5)
        >>> fa.Restart(attempts=0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: restart attempts must be an integer ≥ 1, got 0
    """

    attempts: int = 5
    backoff: float = 1.0
    """Seconds before the first start, and the first wait between failed starts."""
    max_backoff: float = 60.0
    """Longest wait between two starts."""

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise InvalidParameterError(f"restart attempts must be an integer ≥ 1, got {self.attempts!r}")
        for what in ("backoff", "max_backoff"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise InvalidParameterError(f"restart {what} must be a finite number ≥ 0, got {value!r}")


@dataclass(eq=False)
class PoolModel:
    """A model of the pool: its engine and the limits it was added with."""

    name: str
    engine: Engine
    in_flight: int | None
    """Its own in-flight limit (``None``: the pool's)."""
    token_budget: TokenBudget
    """Its token budget setting."""
    device: str = LOCAL
    """The device it runs on (:mod:`fairagents.policies.devices`)."""
    start_time: float | None = None
    """Seconds its engine took to start, last time: the retry hint while it restarts."""


class Pool:
    """The models of an arbiter, by name.

    Args:
        in_flight: the in-flight limit of models added without their own.
        token_budget: the token budget of models added without their own.
        policy: the seat of the pool's policy for its first device, which in-engine schedulers share with the arbiter.
        make_policy: makes the policy of each further device (default: devices share ``policy``'s seat).

    Examples:
        >>> from fairagents.runtime.pool import Pool
        >>> Pool(in_flight=0, token_budget=None)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: in-flight limit must be an integer ≥ 1, got 0
    """

    def __init__(self, *, in_flight: int | None, token_budget: TokenBudget, policy: PoolPolicy | None = None,
                 make_policy: Callable[[], Policy] | None = None) -> None:
        if in_flight is not None:
            check_limit(in_flight)
        check_budget(token_budget)
        self.in_flight = in_flight
        self.token_budget = token_budget
        self.models: dict[str, PoolModel] = {}
        self.devices: Devices | None = None
        """Each model's device and each device's seat of the policy (``None``: a pool without a policy)."""
        if policy is not None:
            self.devices = Devices(make_policy or policy_factory(policy.policy, policy.policy, policy.cost), policy)

    @property
    def policy(self) -> PoolPolicy | None:
        """The seat of the pool's policy on its first device, shared by the arbiter and the engines that schedule by it."""
        return None if self.devices is None else self.devices.primary

    def seat(self, model: str) -> PoolPolicy | None:
        """The seat of the policy on ``model``'s device (``None``: a pool without a policy)."""
        return None if self.devices is None else self.devices.seat(model)

    def add(
        self, name: str, engine: Engine, *, in_flight: int | None = None, token_budget: TokenBudget | bool = False,
        device: str | None = None,
    ) -> PoolModel:
        """Add a model (``token_budget=False``: the pool's budget setting; ``device``: :func:`default_device`)."""
        if not isinstance(name, str) or not name:
            raise InvalidParameterError(f"model name must be a non-empty string, got {name!r}")
        if name in self.models:
            raise InvalidParameterError(f"model {name!r} is already in the pool", model=name)
        if in_flight is not None:
            check_limit(in_flight)
        if token_budget is not False:
            check_budget(token_budget)
        device = default_device(name, engine) if device is None else device
        if self.devices is not None:
            self.devices.assign(name, device)
        elif not isinstance(device, str) or not device:
            raise InvalidParameterError(f"a device is a non-empty string, got {device!r}", model=name)
        budget = self.token_budget if token_budget is False else token_budget
        model = self.models[name] = PoolModel(name, engine, in_flight, budget, device)  # type: ignore[arg-type]
        return model

    async def add_started(
        self, name: str, engine: Engine, *, in_flight: int | None = None, token_budget: TokenBudget | bool = False,
        device: str | None = None,
    ) -> PoolModel:
        """:meth:`add` a model and start its engine; if the start fails, the model is not added."""
        m = self.add(name, engine, in_flight=in_flight, token_budget=token_budget, device=device)
        try:
            await self.start([m])
        except BaseException:
            del self.models[name]
            if self.devices is not None:
                self.devices.unassign(name)
            raise
        return m

    def share_policy(self, name: str, engine: Engine, in_flight: int | None = None, device: str | None = None) -> None:
        """An engine that schedules by the pool's policy itself takes the seat of its device's, as model ``name``.

        Its batch is capped at the model's in-flight limit when one is set (``in_flight``,
        else the pool's). An engine serving requests under another pool's policy is refused.
        """
        if not schedules_fairly(engine) or name in self.models or self.devices is None:
            return
        seat = self.devices.seat_on(default_device(name, engine) if device is None else device)
        caps = capabilities(engine)
        assert caps.share_policy is not None  # an engine with scheduler="fair" binds a policy
        try:
            caps.share_policy(seat, name, in_flight if in_flight is not None else self.in_flight)
        except ProtocolError as err:
            raise InvalidParameterError(
                f"model {name!r}'s engine is running under another arbiter's policy, serving its requests; add "
                "it to this one once they have ended", model=name) from err

    def get(self, name: str) -> PoolModel:
        """The model of that name; raises :class:`~fairagents.UnknownModelError`."""
        m = self.models.get(name)
        if m is None:
            raise UnknownModelError.among(name, self.models)
        return m

    def limit(self, m: PoolModel) -> int:
        """``m``'s in-flight limit: its own, the pool's, its engine's batch capacity, or :data:`DEFAULT_IN_FLIGHT`.

        An engine that schedules by the pool's policy itself (``engine.scheduler ==
        "fair"``) is handed each request at once: its limit is its batch capacity, capped
        inside the engine by the model's (or the pool's) in-flight limit when set, and the
        base of its apps' shares and of :meth:`fairagents.Arbiter.bound`.
        """
        capacity = capabilities(m.engine).max_num_seqs
        if schedules_fairly(m.engine):  # the engine's batch, capped inside the engine by a limit set here
            batch = capacity if isinstance(capacity, int) and capacity > 0 else DEFAULT_IN_FLIGHT
            cap = m.in_flight if m.in_flight is not None else self.in_flight
            return batch if cap is None else min(cap, batch)
        if m.in_flight is not None:
            return m.in_flight
        if self.in_flight is not None:
            return self.in_flight
        capacity = capabilities(m.engine).max_num_seqs
        return capacity if isinstance(capacity, int) and capacity > 0 else DEFAULT_IN_FLIGHT

    def budget(self, m: PoolModel) -> int | None:
        """``m``'s token budget in tokens (``"engine"``: its engine's KV capacity, once started), or ``None``."""
        if m.token_budget != "engine":
            return m.token_budget  # type: ignore[return-value]
        if schedules_fairly(m.engine):
            return None  # it schedules and preempts itself: reserving its KV in front of it would only idle it
        capacity = capabilities(m.engine).token_capacity
        return capacity if isinstance(capacity, int) and not isinstance(capacity, bool) and capacity > 0 else None

    @staticmethod
    def block(m: PoolModel) -> int:
        """Tokens of ``m``'s engine's KV block (1 if it reports none)."""
        block = capabilities(m.engine).kv_block_size
        return block if isinstance(block, int) and not isinstance(block, bool) and block > 0 else 1

    async def start(self, models: list[PoolModel]) -> None:
        """Start the engines of ``models`` in parallel; if one fails, stop them all and raise its error."""
        results = await asyncio.gather(*(_timed_start(m) for m in models), return_exceptions=True)
        failures = [(m, r) for m, r in zip(models, results, strict=True) if isinstance(r, BaseException)]
        if failures:
            await self.stop(models)
            m, failure = failures[0]
            if isinstance(failure, ModelLoadError) and failure.model is None:
                raise ModelLoadError(f"model {m.name!r}: {failure}", model=m.name) from failure
            raise failure

    @staticmethod
    async def restart(m: PoolModel, restart: Restart) -> None:
        """Stop ``m``'s engine and start it again, up to ``restart.attempts`` times, with doubling waits between.

        Raises the last attempt's error if none succeeds.
        """
        retrying = tenacity.AsyncRetrying(stop=tenacity.stop_after_attempt(restart.attempts), reraise=True,
                                          wait=tenacity.wait_exponential(multiplier=restart.backoff,
                                                                         max=restart.max_backoff))
        async for attempt in retrying:
            with attempt:
                await m.engine.stop()
                await _timed_start(m)

    async def stop(self, models: list[PoolModel] | None = None) -> None:
        """Stop the engines of ``models`` (default: all), in parallel; a failure to stop is not raised."""
        models = list(self.models.values()) if models is None else models
        await asyncio.gather(*(m.engine.stop() for m in models), return_exceptions=True)


async def _timed_start(m: PoolModel) -> None:
    began = time.perf_counter()
    await m.engine.start()
    m.start_time = time.perf_counter() - began


def default_device(model: str, engine: Engine) -> str:
    """``model``'s device unless told: a remote model's replicas are a device of their own, in-process engines share :data:`~fairagents.policies.devices.LOCAL`.

    Examples:
        >>> from fairagents.runtime.pool import default_device
        >>> from fairagents.testing import FakeEngine
        >>> default_device("chat", FakeEngine()), default_device("remote", FakeEngine(shared_capacity=True))
        ('local', 'remote')
    """
    return model if capabilities(engine).shared_capacity else LOCAL


def schedules_fairly(engine: object) -> bool:
    """Whether ``engine`` orders and preempts by the pool's policy itself (``VLLMEngine()``, ``scheduler="fair"``).

    Examples:
        >>> from fairagents.runtime.pool import schedules_fairly
        >>> from fairagents.engines.vllm import VLLMEngine
        >>> schedules_fairly(VLLMEngine()), schedules_fairly(VLLMEngine(scheduler="vllm"))
        (True, False)
    """
    return capabilities(engine).scheduler == "fair"


def check_limit(value: object) -> None:
    """Raise unless ``value`` is an integer ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError(f"in-flight limit must be an integer ≥ 1, got {value!r}")


def check_budget(value: object) -> None:
    """Raise unless ``value`` is a token budget setting."""
    if value == "engine" or value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameterError(f"token budget must be 'engine', an integer ≥ 1 or None, got {value!r}")
