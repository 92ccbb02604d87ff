"""The runtime: the arbiter and the parts it is composed of.

- :mod:`~fairagents.runtime.arbiter`: :class:`Arbiter`, the public face: declarations,
  calls, lifecycle and state, each delegated to a part below.
- :mod:`~fairagents.runtime.inputs`: a call's checks and prompt preparation;
  :mod:`~fairagents.runtime.sampling` the call's sampling arguments;
  :mod:`~fairagents.engines.prompts` and :mod:`~fairagents.runtime.preprocessing` the
  prompt work, on and off the event loop.
- :mod:`~fairagents.runtime.runner`: the dispatcher's decisions carried out: futures,
  streams, the end of each request.
- :mod:`~fairagents.runtime.lifecycle`: start, drain, close, restart.
- :mod:`~fairagents.runtime.pool` (models and their limits),
  :mod:`~fairagents.runtime.tenants` (declared apps and agents),
  :mod:`~fairagents.runtime.handles` (what agents call through),
  :mod:`~fairagents.runtime.portal` (calls from other loops and threads),
  :mod:`~fairagents.runtime.selector` (a model of the pool as the adaptive policy's selector).
"""

from fairagents.runtime.arbiter import Arbiter
from fairagents.runtime.handles import AgentHandle, AppHandle
from fairagents.runtime.pool import DEFAULT_IN_FLIGHT, Restart
from fairagents.runtime.portal import Portal
from fairagents.runtime.sampling import ChatArgs, SamplingArgs

__all__ = ["DEFAULT_IN_FLIGHT", "AgentHandle", "AppHandle", "Arbiter", "ChatArgs", "Portal", "Restart", "SamplingArgs"]
