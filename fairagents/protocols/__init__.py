"""The protocols agents speak besides chat completions, each translated to one core and back.

A request of Anthropic's Messages API (:mod:`~fairagents.protocols.anthropic`) or of OpenAI's
Responses API (:mod:`~fairagents.protocols.responses`) is read into its own pydantic model,
then translated into the core, an OpenAI chat request
(:class:`~fairagents.openai_request.ChatCompletionRequest`): the same validation, limits,
tools, output formats and charging as every chat. Its answer, replies or a stream read as
content blocks (:mod:`~fairagents.protocols.blocks`), is rendered in the protocol's own
shape, errors included. Nothing here knows HTTP: the server's routes
(:mod:`fairagents.server.routes`) do.

Examples:
    >>> from fairagents.protocols import anthropic
    >>> body, chat = anthropic.read(b'{"model": "chat", "max_tokens": 16, "system": "Be brief.",'
    ...                             b' "messages": [{"role": "user", "content": "hi"}]}')
    >>> [(m.role, m.content) for m in chat.messages], chat.max_tokens
    ([('system', 'Be brief.'), ('user', 'hi')], 16)
"""

__all__: list[str] = []
