"""fairagents: fair model serving across multi-agent, multi-modal applications.

Examples:
    >>> import fairagents as fa
    >>> planner = fa.Agent("planner", fa.App("driving", weight=2.0))
    >>> planner.app.weight
    2.0
"""

from __future__ import annotations

from fairagents import engines, policies
from fairagents.admission import Statera
from fairagents.runtime.arbiter import AgentHandle, AppHandle, Arbiter, Restart
from fairagents.cost import CostModel, ModelProfile, RawTokenCost, UnifiedTokenCost, prompt_cost, service_bound
from fairagents.errors import (
    BadInputError,
    ContextLengthError,
    EngineError,
    FairAgentsError,
    InvalidImageError,
    InvalidParameterError,
    ModalityError,
    ModelLoadError,
    OverloadedError,
    ShutdownError,
    UnknownAgentError,
    UnknownAppError,
    UnknownModelError,
)
from fairagents.identity import SLO, Agent, App, Modality, acting_as, agent, current_agent, current_run, run_scope
from fairagents.limits import RequestLimits
from fairagents.runtime.portal import Portal
from fairagents.reply import ImageReply, Reply, Timing, TokenLogprob, Usage
from fairagents.tools import ToolCall
from fairagents.request import Outcome, Request
from fairagents.stats import ClientSnapshot, Stats

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentHandle",
    "App",
    "AppHandle",
    "Arbiter",
    "BadInputError",
    "ClientSnapshot",
    "ContextLengthError",
    "CostModel",
    "EngineError",
    "FairAgentsError",
    "ImageReply",
    "InvalidImageError",
    "InvalidParameterError",
    "Modality",
    "ModalityError",
    "ModelLoadError",
    "ModelProfile",
    "Outcome",
    "OverloadedError",
    "Portal",
    "RawTokenCost",
    "Reply",
    "Request",
    "RequestLimits",
    "Restart",
    "SLO",
    "ShutdownError",
    "Statera",
    "Stats",
    "Timing",
    "TokenLogprob",
    "ToolCall",
    "UnifiedTokenCost",
    "UnknownAgentError",
    "UnknownAppError",
    "UnknownModelError",
    "Usage",
    "__version__",
    "acting_as",
    "agent",
    "current_agent",
    "current_run",
    "engines",
    "policies",
    "prompt_cost",
    "run_scope",
    "service_bound",
]
