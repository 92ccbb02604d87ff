"""A selector for the adaptive policy that asks a model of the pool (H-MAS's ``Π_meta`` as an LLM).

The prompt and the validation of the reply are pure and live with the policy
(:mod:`fairagents.policies.decision`); this module makes the call.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.policies import Adaptive
    >>> from fairagents.runtime.selector import ModelSelector
    >>> arbiter = fa.Arbiter()
    >>> ask = ModelSelector(arbiter, "chat", arbiter.app("fairagents").agent("meta-controller"))
    >>> policy = Adaptive(selector=ask)
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fairagents.identity import Agent
from fairagents.policies.decision import decision_prompt
from fairagents.runtime.handles import AgentHandle

__all__ = ["ModelSelector"]


class ModelSelector:
    """A selector for :class:`~fairagents.policies.adaptive.Adaptive` that asks ``model`` through ``arbiter``.

    Called with a view, it returns an :class:`asyncio.Task` on the running event loop
    that sends :func:`~fairagents.policies.decision.decision_prompt` as a chat message and returns the reply's text;
    the policy polls the task at its next events, validates the text with
    :func:`~fairagents.policies.decision.parse_decision`, and falls back to its rules when the answer is malformed,
    fails, or is not there within ``selector_timeout`` (the task is then cancelled).

    The call is an ordinary request: it goes through the same fair dispatcher as any
    other, as ``agent``, an identity declared on the arbiter (e.g.
    ``arbiter.app("fairagents").agent("meta-controller")``), and it counts in the
    statistics the controller reads. Called with no running event loop (in the
    simulator, say), it raises :class:`RuntimeError`, which the policy counts as an
    error and answers with its rules.

    By default the reply is not constrained, so the model may answer anything (a model
    that is not instruction-tuned, such as the embedded random-weight one, answers
    gibberish, and every decision then falls back to the rules). For a model whose
    engine enforces structured outputs, pass ``response_format={"type": "json_object"}``
    and every answer is at least a JSON object.

    Args:
        arbiter: the arbiter (anything with its ``chat`` coroutine method).
        model: the model of the pool to ask.
        agent: who asks (an agent handle, or a declared :class:`~fairagents.Agent`).
        max_tokens: the reply's length limit.
        temperature: sampling temperature (0: greedy).
        response_format: the chat's ``response_format`` (``None``: unconstrained).

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.runtime.selector import ModelSelector
        >>> arbiter = fa.Arbiter()
        >>> ask = ModelSelector(arbiter, "chat", arbiter.app("fairagents").agent("meta-controller"))
        >>> ask({"pool": ["fcfs"]})
        Traceback (most recent call last):
        ...
        RuntimeError: ModelSelector needs a running event loop (an arbiter's); the policy falls back to its rules
    """

    def __init__(
        self,
        arbiter: Any,
        model: str,
        agent: AgentHandle | Agent,
        *,
        max_tokens: int = 64,
        temperature: float = 0.0,
        response_format: dict[str, Any] | None = None,
    ) -> None:
        self.arbiter, self.model, self.agent = arbiter, model, agent
        self.max_tokens, self.temperature, self.response_format = max_tokens, temperature, response_format

    def messages(self, view: Mapping[str, Any]) -> list[dict[str, str]]:
        """The chat messages sent for ``view``."""
        return [{"role": "user", "content": decision_prompt(view)}]

    def __call__(self, view: Mapping[str, Any]) -> asyncio.Task[str]:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "ModelSelector needs a running event loop (an arbiter's); the policy falls back to its rules"
            ) from None
        return loop.create_task(self._ask(self.messages(view)), name="fairagents-meta-controller")

    async def _ask(self, messages: list[dict[str, str]]) -> str:
        constraint = {} if self.response_format is None else {"response_format": self.response_format}
        reply = await self.arbiter.chat(self.model, messages, agent=self.agent, max_tokens=self.max_tokens,
                                        temperature=self.temperature, **constraint)
        return reply.text
