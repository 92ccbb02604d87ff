"""The built-in policies a pool of policies draws from (every one but ``adaptive``, which switches among them)."""

from __future__ import annotations

from fairagents.cost import CostModel
from fairagents.policies.base import BasePolicy, Policy
from fairagents.policies.duet import Duet
from fairagents.policies.edf import EDF
from fairagents.policies.exfairs import ExFairS
from fairagents.policies.fcfs import FCFS
from fairagents.policies.hmfs import HMFS, HMFSCredit
from fairagents.policies.rr import RoundRobin
from fairagents.policies.runs import HMFSRuns
from fairagents.policies.sjf import SJF
from fairagents.policies.two_lane import TwoLane
from fairagents.policies.vtc import VTC
from fairagents.policies.wfq import WFQ

__all__ = ["BASE_POLICIES", "by_name"]

#: The built-in policies by name, ``adaptive`` aside.
BASE_POLICIES: dict[str, type[BasePolicy]] = {
    cls.name: cls for cls in (FCFS, RoundRobin, VTC, HMFS, HMFSCredit, HMFSRuns, ExFairS, Duet, EDF, SJF, WFQ, TwoLane)
}


def by_name(cls: type[BasePolicy], cost: CostModel | None) -> Policy:
    """A built-in policy: given the pool's ``cost`` if it charges unified tokens, else its own (raw tokens)."""
    return cls(cost) if cls.charges_unified_tokens else cls()
