"""Namespaced keys fairagents reads and writes in other systems' metadata.

Kept in one place so an integration and the server agree on the spelling.

Examples:
    >>> from fairagents import constants
    >>> constants.METADATA_AGENT
    'fairagents_agent'
"""

from __future__ import annotations

#: Key under which an app name travels in LangChain/LangGraph run metadata.
METADATA_APP = "fairagents_app"
#: Key under which an agent name travels in LangChain/LangGraph run metadata.
METADATA_AGENT = "fairagents_agent"
#: Key of an app's weight in a vLLM request's ``extra_args`` (read by the in-engine fair scheduler).
XARG_APP_WEIGHT = "fairagents_app_weight"
#: Key of an agent's weight in a vLLM request's ``extra_args`` (read by the in-engine fair scheduler).
XARG_AGENT_WEIGHT = "fairagents_agent_weight"
#: Key under which an agent's weight travels in LangGraph node metadata (used when the agent is declared).
METADATA_WEIGHT = "fairagents_weight"
#: Key under which a run id travels in LangChain/LangGraph run metadata (one graph invocation: one run).
METADATA_RUN = "fairagents_run"
#: Key of a request's run id in a vLLM request's ``extra_args`` (read by the in-engine fair scheduler).
XARG_RUN = "fairagents_run"
#: What a run id is: 1 to 128 letters, digits and ``_.:@/+=-`` (a regular expression, unanchored).
RUN_PATTERN = r"[A-Za-z0-9_.:@/+=\-]{1,128}"
#: HTTP header naming the calling agent on a request to a fairagents server.
HEADER_AGENT = "X-Fairagents-Agent"
#: HTTP header naming the calling app on a request to a fairagents server that runs without API keys.
HEADER_APP = "X-Fairagents-App"
#: HTTP header stating the calling agent's weight inside its app (``2.0``); a server declares a new agent with it.
HEADER_AGENT_WEIGHT = "X-Fairagents-Agent-Weight"
#: HTTP header stating the calling agent's SLO in seconds (``ttft=0.5, tpot=0.05, e2e=4.0``); as the weight.
HEADER_AGENT_SLO = "X-Fairagents-Agent-Slo"
#: HTTP header naming the run (one invocation of an agent workflow) a request belongs to.
HEADER_RUN = "X-Fairagents-Run"
#: Name of the agent a call is charged to when none is given.
DEFAULT_AGENT = "default"
#: Reference embedding width ``d_base`` of unified tokens (HMFS eq. 1).
DEFAULT_D_BASE = 4096
#: Most raw tokens one count may hold: a request's prompt or ``max_tokens``, one report of output.
#: Bounded so that every charge, and every counter it adds to, stays a finite float.
MAX_TOKEN_COUNT = 2**40
#: Largest width (``d_model``, ``d_base``) and depth (``n_layers``) a model profile may state.
MAX_MODEL_WIDTH, MAX_MODEL_DEPTH = 2**20, 2**12
#: Largest price of a raw token (``w_input``, ``w_output``).
MAX_TOKEN_PRICE = 1e3
