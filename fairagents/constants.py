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
#: Name of the agent a call is charged to when none is given.
DEFAULT_AGENT = "default"
#: Reference embedding width ``d_base`` of unified tokens (HMFS eq. 1).
DEFAULT_D_BASE = 4096
