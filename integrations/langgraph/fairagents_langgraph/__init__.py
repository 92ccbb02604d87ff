"""fairagents for LangGraph and LangChain.

- :class:`ChatFairAgents`: a LangChain chat model served by an arbiter in this process,
  or by a fairagents server, with tools and structured output, from sync or async code
  on any loop or thread.
- :func:`fair_graph`: every model call made inside a node of a compiled graph is charged
  to an agent named after the node, and each invocation of the graph is a run; node
  code does not change.

Examples:
    >>> import fairagents_langgraph
    >>> fairagents_langgraph.__all__
    ['AGENT_SEPARATOR', 'ChatFairAgents', 'agent_name', 'fair_graph']
"""

from __future__ import annotations

from fairagents_langgraph.chat_model import ChatFairAgents
from fairagents_langgraph.graph import AGENT_SEPARATOR, agent_name, fair_graph

__all__ = ["AGENT_SEPARATOR", "ChatFairAgents", "agent_name", "fair_graph"]
