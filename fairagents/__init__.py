"""fairagents: fair model serving across multi-agent, multi-modal applications.

Example:
    >>> import fairagents as fa
    >>> planner = fa.Agent("planner", fa.App("driving", weight=2.0))
    >>> planner.app.weight
    2.0
"""

from __future__ import annotations

from fairagents import engines, policies
from fairagents.cost import CostModel, ModelProfile, RawTokenCost, UnifiedTokenCost, service_bound
from fairagents.errors import (
    BadInputError,
    ContextLengthError,
    EngineError,
    FairAgentsError,
    InvalidParameterError,
    UnknownAgentError,
    UnknownAppError,
    UnknownModelError,
)
from fairagents.identity import SLO, Agent, App, Modality, acting_as, agent, current_agent
from fairagents.request import Outcome, Request

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "App",
    "BadInputError",
    "ContextLengthError",
    "CostModel",
    "EngineError",
    "FairAgentsError",
    "InvalidParameterError",
    "Modality",
    "ModelProfile",
    "Outcome",
    "RawTokenCost",
    "Request",
    "SLO",
    "UnifiedTokenCost",
    "UnknownAgentError",
    "UnknownAppError",
    "UnknownModelError",
    "__version__",
    "acting_as",
    "agent",
    "current_agent",
    "engines",
    "policies",
    "service_bound",
]
