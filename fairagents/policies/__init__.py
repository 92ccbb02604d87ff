"""Scheduling policies: which waiting request a model runs next.

| name       | class          | what it does |
| ---------- | -------------- | ------------ |
| `fcfs`     | :class:`FCFS`  | arrival order (vLLM's default; the baseline) |
| `rr`       | :class:`RoundRobin` | one dispatch per app in turn |
| `vtc`      | :class:`VTC`   | flat virtual token counter per client, raw tokens |
| `hmfs`     | :class:`HMFS`  | hierarchical (apps, then agents), weighted, unified tokens (the paper's) |
| `hmfs_credit` | :class:`HMFSCredit` | HMFS where an app back from idle keeps up to `U` of its lag (light apps' bursts run ahead); the default |
| `hmfs_runs` | :class:`HMFSRuns` | HMFS between apps; inside an app, fair queueing over workflow runs |
| `exfairs`  | :class:`ExFairS` | SLO-aware experiential fairness: SAFI, credit exchange, proportional insertion (ExFairS) |
| `duet`     | :class:`Duet`  | arrival, then predicted cost, with aging past the p90 wait (DuetInfer) |
| `edf`      | :class:`EDF`   | earliest deadline from the SLOs and the predicted length (H-MAS pool) |
| `sjf`      | :class:`SJF`   | shortest predicted service time, with an aging guard (H-MAS pool) |
| `wfq`      | :class:`WFQ`   | weighted fair queueing by virtual finish time (H-MAS pool) |
| `two_lane` | :class:`TwoLane` | fast and slow lanes by predicted service time, slack order in each (H-MAS pool) |
| `adaptive` | :class:`Adaptive` | H-MAS's meta controller: switches among the pool by rules, with rollback |

Examples:
    >>> import fairagents as fa
    >>> sorted(fa.policies.POLICIES)
    ['adaptive', 'duet', 'edf', 'exfairs', 'fcfs', 'hmfs', 'hmfs_credit', 'hmfs_runs', 'rr', 'sjf', 'two_lane', 'vtc', 'wfq']
    >>> fa.policies.make_policy("hmfs").name
    'hmfs'
"""

from __future__ import annotations

import importlib

from fairagents.constants import DEFAULT_D_BASE
from fairagents.cost import DEFAULT_W_CACHED, CostModel, UnifiedTokenCost
from fairagents.errors import InvalidParameterError
from fairagents.policies.adaptive import Adaptive
from fairagents.policies.base import BasePolicy, DefersInput, Policy
from fairagents.policies.duet import Duet
from fairagents.policies.edf import EDF
from fairagents.policies.exfairs import ExFairS
from fairagents.policies.fcfs import FCFS
from fairagents.policies.hmfs import HMFS, HMFSCredit
from fairagents.policies.registry import BASE_POLICIES, by_name
from fairagents.policies.rr import RoundRobin
from fairagents.policies.runs import HMFSRuns
from fairagents.policies.sjf import SJF
from fairagents.policies.two_lane import TwoLane
from fairagents.policies.vtc import VTC
from fairagents.policies.wfq import WFQ

__all__ = [
    "Adaptive", "BasePolicy", "DEFAULT_POLICY", "DefersInput", "Duet", "EDF", "ExFairS", "FCFS", "HMFS", "HMFSCredit",
    "HMFSRuns", "POLICIES", "Policy", "RoundRobin", "SJF", "TwoLane", "VTC", "WFQ", "make_policy", "priced_policy"
]

#: Built-in policies by name.
POLICIES: dict[str, type[BasePolicy]] = {**BASE_POLICIES, Adaptive.name: Adaptive}
#: The policy of an arbiter, a server, and an in-engine scheduler served on its own, when none is named:
#: HMFS with the idle credit (the workflows guide has the numbers that chose it).
DEFAULT_POLICY = HMFSCredit.name


def make_policy(policy: str | Policy, cost: CostModel | None = None) -> Policy:
    """A policy from its name, from ``"module:Class"``, or the policy itself (returned as is).

    ``cost`` is the pool's unified-token cost model; a policy built by name gets it
    if it charges unified tokens (``hmfs``) and keeps raw tokens otherwise (``vtc``
    as in its paper; ``fcfs`` and ``rr`` do not count service). Build a policy
    yourself for another combination, e.g. ``VTC(cost)`` for VTC on unified tokens.

    ``"module:Class"`` (or ``"module:factory"``) imports ``module`` and calls what it
    names with no arguments, as uvicorn's ``module:app`` names an app: that is how a
    configuration file or a command line names a policy of your own. It must return a
    policy (subclass :class:`BasePolicy`).

    Examples:
        >>> import fairagents as fa
        >>> fa.policies.make_policy("fairagents.policies:FCFS").name
        'fcfs'
        >>> fa.policies.make_policy("nope")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: unknown policy 'nope'; choose from adaptive, duet, edf, exfairs, fcfs, hmfs, hmfs_credit, hmfs_runs, rr, sjf, two_lane, vtc, wfq
        >>> fa.policies.make_policy("fairagents.policies:Nope")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: policy 'fairagents.policies:Nope': module 'fairagents.policies' has no attribute 'Nope'
    """
    if isinstance(policy, str) and ":" in policy:
        return _import_policy(policy)
    if isinstance(policy, str):
        try:
            cls = POLICIES[policy]
        except KeyError:
            raise InvalidParameterError(
                f"unknown policy {policy!r}; choose from {', '.join(sorted(POLICIES))}"
            ) from None
        return by_name(cls, cost)
    if isinstance(policy, Policy):
        return policy
    missing = [name for name in _PROTOCOL if not callable(getattr(policy, name, None))]
    if not isinstance(getattr(policy, "name", None), str):
        missing.insert(0, "name")
    if len(missing) < len(_PROTOCOL):  # a policy written against part of the interface
        raise InvalidParameterError(
            f"policy {policy!r} lacks {', '.join(missing)}; subclass fairagents.policies.BasePolicy to inherit them"
        )
    raise InvalidParameterError(f"policy must be a name or a Policy, got {policy!r}")


def priced_policy(
    policy: str | Policy, *, d_base: int | None = None, w_input: float | None = None, w_output: float | None = None,
    w_cached: float | None = None,
) -> tuple[Policy, UnifiedTokenCost]:
    """The policy and the one unified cost model that prices service for it and for the ledger.

    A name is built with a new cost model of these settings (defaults: ``d_base`` 4096,
    ``w_input`` 1, ``w_output`` 2, ``w_cached`` 0.1). A policy object that prices in unified tokens brings
    its own cost model, which is used as it is (an arbiter then registers each model's
    profile in it); settings given here that contradict it are an error. A policy that
    counts raw tokens on purpose (``VTC()``) keeps them; the ledger still prices in
    unified tokens.

    Examples:
        >>> import fairagents as fa
        >>> policy = fa.policies.HMFS()
        >>> fa.policies.priced_policy(policy)[1] is policy.cost
        True
        >>> fa.policies.priced_policy(fa.policies.HMFS(), w_output=3.0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: the policy prices with w_output=2.0, not 3.0
    """
    given = {"d_base": d_base, "w_input": w_input, "w_output": w_output, "w_cached": w_cached}
    cost = UnifiedTokenCost(
        d_base=DEFAULT_D_BASE if d_base is None else d_base,
        w_input=1.0 if w_input is None else w_input,
        w_output=2.0 if w_output is None else w_output,
        w_cached=DEFAULT_W_CACHED if w_cached is None else w_cached,
    )
    policy = make_policy(policy, cost)
    own = getattr(policy, "cost", None)
    if isinstance(own, UnifiedTokenCost) and own is not cost:
        for name, value in given.items():
            if value is not None and value != getattr(own, name):
                raise InvalidParameterError(f"the policy prices with {name}={getattr(own, name)}, not {value}")
        cost = own
    return policy, cost


_PROTOCOL = tuple(name for name, member in vars(Policy).items() if not name.startswith("_") and callable(member))


def _import_policy(spec: str) -> Policy:
    """The policy ``"module:attr"`` names: ``attr`` of ``module``, called with no arguments.

    Every failure is one :class:`~fairagents.InvalidParameterError` line naming ``spec``
    and what failed: the import, the attribute, the call, or what the call returned.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        names = ", ".join(sorted(POLICIES))
        raise InvalidParameterError(f"policy {spec!r}: a policy is a name ({names}) or 'module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and (module_name + ".").startswith(err.name + "."):  # the module (or its package)
            raise InvalidParameterError(f"policy {spec!r}: no module named {err.name!r}") from None
        raise InvalidParameterError(f"policy {spec!r}: importing {module_name!r} failed: {_one_line(err)}") from None
    except Exception as err:
        raise InvalidParameterError(f"policy {spec!r}: importing {module_name!r} failed: {_one_line(err)}") from None
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            owner = module_name if target is module else f"{module_name}:{attr.rpartition('.')[0]}"
            raise InvalidParameterError(f"policy {spec!r}: module {owner!r} has no attribute {part!r}")
        target = getattr(target, part)
    if not callable(target):
        raise InvalidParameterError(f"policy {spec!r}: {attr} is not a class or factory, it is {target!r}")
    try:
        policy = target()
    except Exception as err:
        raise InvalidParameterError(f"policy {spec!r}: {attr}() failed: {_one_line(err)}") from None
    if not isinstance(policy, Policy) or not isinstance(getattr(policy, "name", None), str):
        raise InvalidParameterError(
            f"policy {spec!r}: {attr}() returned {type(policy).__name__}, not a policy "
            "(subclass fairagents.policies.BasePolicy)"
        )
    return policy


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"
