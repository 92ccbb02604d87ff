"""Tool calling and structured output: what a chat call asks of the model's output, and reading it back.

A chat call may carry OpenAI-style ``tools``, a ``tool_choice`` and a
``response_format``. :meth:`OutputSpec.of` checks them (a typed
:class:`~fairagents.InvalidParameterError`, before anything is charged) and says:

- which tools the model's **chat template** renders (:attr:`OutputSpec.template_tools`);
- the **constraint** the engine enforces while decoding (:meth:`OutputSpec.constraint`,
  vLLM's ``StructuredOutputsParams`` fields): for ``tool_choice="required"`` an array
  of ``{"name", "parameters"}`` objects (one item without ``parallel_tool_calls``), for
  a named function its parameters, as vLLM's OpenAI server builds them; JSON for
  ``{"type": "json_object"}``, the given schema for ``{"type": "json_schema"}``; and
  nothing with ``tool_choice="auto"``, where the model may answer or call.
- how to **read** the output back (:class:`ToolReader`): with ``"auto"``, the model's
  tool parser (vLLM's, chosen per model family) finds the calls in the text; with
  ``"required"`` or a named function the constrained JSON is the call.

Because the constraint is enforced in decoding, a model that never saw a tool (the
embedded random-weight one included) still returns a valid call when one is required.

Examples:
    >>> from fairagents.tools import OutputSpec
    >>> weather = {"type": "function", "function": {"name": "weather",
    ...            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    >>> spec = OutputSpec.of(tools=[weather], tool_choice="required")
    >>> spec.constraint()["json"]["items"]["anyOf"][0]["properties"]["name"]
    {'type': 'string', 'enum': ['weather']}
    >>> reader = spec.reader()
    >>> _ = reader.feed('[{"name": "weather", "parameters": {"city": "Oslo"}}]')
    >>> content, calls = reader.finish()
    >>> calls[0].name, calls[0].arguments
    ('weather', '{"city":"Oslo"}')
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fairagents.errors import InvalidParameterError
from fairagents.limits import DEFAULT_LIMITS, RequestLimits

__all__ = [
    "OutputSpec", "ToolCall", "ToolCallDelta", "ToolReader", "check_output", "check_tool_replies", "infer_tool_parser",
    "merge_pieces", "output_reader", "tool_parser_for",
]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_JSON_SPACE = " \t\n\r"  # the whitespace JSON allows between its tokens


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model made.

    Examples:
        >>> from fairagents.tools import ToolCall
        >>> call = ToolCall(id="call_1", name="weather", arguments='{"city": "Oslo"}')
        >>> call.parsed_arguments()
        {'city': 'Oslo'}
        >>> call.as_openai()["function"]["name"]
        'weather'
    """

    id: str
    """The call's id; a ``tool`` message answering it carries it as ``tool_call_id``."""
    name: str
    """The function's name (one of the request's tools)."""
    arguments: str
    """The arguments as JSON text, as the OpenAI API carries them."""

    def parsed_arguments(self) -> Any:
        """The arguments decoded (raises :class:`json.JSONDecodeError` if the model cut them short)."""
        return json.loads(self.arguments)

    def as_openai(self) -> dict[str, Any]:
        """The call as an assistant message's ``tool_calls`` item."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call: the first of a call has its ``id`` and ``name``.

    Concatenating the ``arguments`` of the deltas of one ``index`` gives the call's arguments.

    Examples:
        >>> from fairagents.tools import ToolCallDelta
        >>> ToolCallDelta(index=0, id="call_1", name="weather").as_openai()
        {'index': 0, 'id': 'call_1', 'type': 'function', 'function': {'name': 'weather', 'arguments': ''}}
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def as_openai(self) -> dict[str, Any]:
        """The delta as a stream chunk's ``delta.tool_calls`` item."""
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            function = {"name": self.name, **function}
        out["function"] = function
        return out


def new_call_id() -> str:
    """A fresh tool-call id (``call_`` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class OutputSpec:
    """What a chat call asks of its output: tools to offer or require, and a response format.

    Build it with :meth:`of`, which validates its arguments.

    Examples:
        >>> from fairagents.tools import OutputSpec
        >>> OutputSpec.of(response_format={"type": "json_object"}).constraint()
        {'json_object': True}
        >>> OutputSpec.of(tool_choice="required")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: tool_choice 'required' needs tools
    """

    tools: tuple[dict[str, Any], ...] = ()
    """The function tools, as ``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    tool_choice: Literal["none", "auto", "required", "function"] = "auto"
    """``"function"`` when a named function is forced (:attr:`function`)."""
    function: str | None = None
    parallel_tool_calls: bool = True
    """Whether the model may make several calls in one turn (enforced under ``"required"``)."""
    response_format: dict[str, Any] | None = field(default=None)
    """``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name", "schema"}}``;
    ``None`` for text."""

    @classmethod
    def of(
        cls,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool | None = None,
        response_format: Mapping[str, Any] | None = None,
        limits: RequestLimits | None = None,
    ) -> OutputSpec:
        """Check and normalize a call's ``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``response_format``.

        ``tool_choice`` is ``"none"``, ``"auto"`` (the default with tools), ``"required"``
        or ``{"type": "function", "function": {"name": ...}}``. Raises
        :class:`~fairagents.InvalidParameterError` for a malformed tool (a name outside
        ``[A-Za-z0-9_.-]{1,64}``, duplicate names, parameters that are not a JSON-schema
        object), a choice naming no given tool, or a malformed response format; and for
        tools or a constraint past ``limits`` (default: :data:`fairagents.limits.DEFAULT_LIMITS`),
        which bound the work of compiling the constraint.
        """
        limits = limits or DEFAULT_LIMITS
        limits.check_tools(tools if isinstance(tools, Sequence) and not isinstance(tools, str | bytes) else None)
        checked = _check_tools(tools)
        choice, function = _check_choice(tool_choice, checked)
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise InvalidParameterError(f"parallel_tool_calls must be true or false, got {parallel_tool_calls!r}",
                                        param="parallel_tool_calls")
        spec = cls(
            tools=checked, tool_choice=choice, function=function,
            parallel_tool_calls=True if parallel_tool_calls is None else parallel_tool_calls,
            response_format=_check_response_format(response_format),
        )
        forced = choice in ("required", "function")
        limits.check_constraint(spec.constraint(), param="tools" if forced else "response_format")
        return spec

    @property
    def calls_tools(self) -> bool:
        """Whether the model may call a tool (tools given, and the choice is not ``"none"``)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def plain(self) -> bool:
        """Whether the spec asks nothing of the output (no tools offered, text format)."""
        return not self.tools and self.response_format is None

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the chat template renders into the prompt (``None``: none)."""
        return [dict(t) for t in self.tools] if self.tools else None

    def constraint(self) -> dict[str, Any] | None:
        """The structured-output constraint for decoding, as vLLM's ``StructuredOutputsParams`` fields.

        A required or named tool call takes precedence over a response format, as in
        vLLM's OpenAI server.
        """
        if self.tool_choice == "function":
            return {"json": _parameters(self._tool(self.function))}
        if self.tool_choice == "required":
            defs: dict[str, Any] = {}
            options = []
            for t in self.tools:
                parameters = _parameters(t)
                for name, schema in (parameters.pop("$defs", None) or {}).items():
                    if defs.setdefault(name, schema) != schema:
                        raise InvalidParameterError(f"tools define ${{defs}} {name!r} differently; rename one",
                                                    param="tools")
                options.append({"properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                               "parameters": parameters},
                                "required": ["name", "parameters"]})
            required: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": options}}
            if not self.parallel_tool_calls:
                required["maxItems"] = 1
            if defs:
                required["$defs"] = defs  # references ("#/$defs/...") resolve from the root
            return {"json": required}
        if self.response_format is None:
            return None
        if self.response_format["type"] == "json_object":
            return {"json_object": True}
        return {"json": self.response_format["json_schema"]["schema"]}

    def reader(self, parser: Any = None) -> ToolReader:
        """A reader of this call's output; ``parser`` is the model's tool parser, needed under ``"auto"``."""
        return ToolReader(self, parser)

    def _tool(self, name: str | None) -> dict[str, Any]:
        return next(t for t in self.tools if t["function"]["name"] == name)


class ToolReader:
    """Reads a call's output as it streams: content, and the tool calls the spec lets the model make.

    :meth:`feed` takes each new piece of text and returns the content and tool-call
    deltas to send on; :meth:`finish` returns the whole content and calls once the
    output ended, and :meth:`flush` what a stream still owes then (content held back,
    calls or pieces unsent), so that a stream always adds up to :meth:`finish` — the
    reply a call without streaming gets — whatever the model wrote.

    Under ``"auto"``, content streams as it comes until the model begins a call (the
    model's vLLM ``ToolParser`` tells the two apart as the text arrives); the calls are
    then read from the whole output, as a reply's are, and sent whole at the end. So a
    call that turns out malformed or cut short is content, in the stream as in the
    reply. Content streams so only with parsers whose streamed content is always the
    start of what they read in the whole output (``hermes``); with others it comes at
    the end too. Under ``"required"`` the output is a JSON array of ``{"name", "parameters"}``
    and its calls are sent when it is complete (cut short, it is content). Under a named
    function the output is the call's arguments, streamed as they come: from the first
    character of the JSON value on, with whitespace held until what follows it, so no
    piece is whitespace alone and the pieces add up to the reply's arguments (the
    value without the whitespace around it).

    Examples:
        >>> from fairagents.tools import OutputSpec
        >>> f = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
        >>> reader = OutputSpec.of(tools=[f], tool_choice={"type": "function", "function": {"name": "add"}}).reader()
        >>> first = reader.feed('{"a": 1')[1]
        >>> first[0].name, first[1].arguments
        ('add', '{"a": 1')
        >>> reader.feed(', "b": 2}')[1][0].arguments
        ', "b": 2}'
        >>> reader.finish()[1][0].arguments
        '{"a": 1, "b": 2}'
    """

    def __init__(self, spec: OutputSpec, parser: Any = None) -> None:
        self.spec = spec
        self.text = ""
        # Constrained output is JSON; grammars let raw control characters into strings, which JSON forbids.
        self._escape = _StringEscaper() if spec.constraint() is not None else None
        self._parser = parser if spec.tool_choice == "auto" and spec.tools else None
        if spec.tool_choice == "auto" and spec.tools and parser is None:
            raise InvalidParameterError("tool_choice 'auto' needs the model's tool parser; the model has none",
                                        param="tool_choice")
        self._request = _parser_request(spec) if self._parser is not None else None
        self._id = new_call_id()
        self._sent: dict[int, tuple[str | None, str | None, str]] = {}  # index -> (id, name, arguments) sent
        self._sent_content = ""
        self._finished: tuple[str, tuple[str | None, list[ToolCall]]] | None = None  # finish() of this text
        # Under "auto": the model began a call, so nothing more streams before the end. With a parser whose
        # streamed content may differ from what it reads in the whole output, content is held back to the end.
        self._in_call = self._parser is not None and not _streams_content(self._parser)

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Take ``text``, the output's next piece; return the content and tool-call deltas to send."""
        if self._escape is not None:
            text = self._escape(text)
        previous, self.text = self.text, self.text + text
        mode = self.spec.tool_choice if self.spec.calls_tools else "none"
        if mode == "none":
            return self._content(text), []
        if mode == "function":
            # The arguments are the JSON value without the whitespace around it: the first piece starts the value
            # and whitespace waits for what follows it, so no piece is whitespace alone (clients that parse the
            # arguments so far after every piece, as openai's stream helper does, fail on one).
            deltas = [] if 0 in self._sent else [ToolCallDelta(0, self._id, self.spec.function)]
            sent = self._sent.get(0, (None, None, ""))[2]
            arguments = self.text.strip(_JSON_SPACE)
            self._sent[0] = (self._id, self.spec.function, arguments)
            if len(arguments) > len(sent):
                deltas.append(ToolCallDelta(0, arguments=arguments[len(sent):]))
            return "", deltas
        if mode == "required" or self._in_call:
            return "", []
        message = self._parser.extract_tool_calls_streaming(
            previous_text=previous, current_text=self.text, delta_text=text, previous_token_ids=[],
            current_token_ids=[], delta_token_ids=[], request=self._request)
        if message is None:  # the parser holds text back (the start of a call's tag, maybe)
            return "", []
        if message.tool_calls:
            self._in_call = True
        return self._content(message.content or ""), []

    def _content(self, text: str) -> str:
        self._sent_content += text
        return text

    def finish(self, text: str | None = None) -> tuple[str | None, list[ToolCall]]:
        """The whole output as content (``None`` when it is all calls) and the tool calls made.

        ``text`` is the whole output, for a reader that was fed none of it.
        """
        if text is not None:
            self.text = _StringEscaper()(text) if self._escape is not None else text
        if self._finished is None or self._finished[0] != self.text:  # read once (a parser may log its errors)
            self._finished = (self.text, self._read())
        content, calls = self._finished[1]
        return content, list(calls)

    def _read(self) -> tuple[str | None, list[ToolCall]]:
        mode = self.spec.tool_choice if self.spec.calls_tools else "none"
        if mode == "none":
            return self.text, []
        if mode == "function":
            return None, [ToolCall(self._id, self.spec.function or "", self.text.strip(_JSON_SPACE))]
        if mode == "required":
            calls = _required_calls(self.text)
            if calls is None:  # cut short (max_tokens): what came back is all there is
                return self.text, []
            return None, [ToolCall(self._sent_id(i), name, args) for i, (name, args) in enumerate(calls)]
        info = self._parser.extract_tool_calls(self.text, self._request)
        if not info.tools_called:
            return self.text, []
        return info.content or None, [
            ToolCall(self._sent_id(i), c.function.name, c.function.arguments) for i, c in enumerate(info.tool_calls)
        ]

    def flush(self) -> tuple[str, list[ToolCallDelta]]:
        """What a stream still owes at its end: the content held back and the calls' unsent deltas.

        With them, the stream's content and deltas add up to :meth:`finish`'s content and calls.

        Examples:
            >>> from fairagents.tools import OutputSpec
            >>> f = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
            >>> reader = OutputSpec.of(tools=[f], tool_choice="required").reader()
            >>> reader.feed('[{"name": "add", "param')   # cut short here (max_tokens)
            ('', [])
            >>> reader.flush()                           # so it is content, as in the reply
            ('[{"name": "add", "param', [])
        """
        content, calls = self.finish()
        content = content or ""
        rest = content[len(self._sent_content):] if content.startswith(self._sent_content) else ""
        self._sent_content += rest
        out: list[ToolCallDelta] = []
        for i, call in enumerate(calls):
            sent_id, sent_name, sent_args = self._sent.get(i, (None, None, ""))
            if sent_name is None:
                out.append(ToolCallDelta(i, call.id, call.name, call.arguments))
            elif call.arguments.startswith(sent_args) and len(call.arguments) > len(sent_args):
                out.append(ToolCallDelta(i, arguments=call.arguments[len(sent_args):]))
            self._sent[i] = (call.id, call.name, call.arguments)
        return rest, out

    def _sent_id(self, index: int) -> str:
        """The id a streamed call was sent with, or a fresh one (the same on every later ask)."""
        sent_id, name, args = self._sent.get(index, (None, None, ""))
        if sent_id is None:
            sent_id = self._id if index == 0 else new_call_id()
            self._sent[index] = (sent_id, name, args)
        return sent_id


# vLLM tool parsers whose streamed content is always a prefix of the content they read in the whole output
# (tested): a stream may send their content as it comes.
_STREAMS_CONTENT = ("hermes",)


def _streams_content(parser: Any) -> bool:
    from vllm.tool_parsers import ToolParserManager

    return any(type(parser) is ToolParserManager.get_tool_parser(name) for name in _STREAMS_CONTENT)


def output_reader(engine: Any, spec: OutputSpec, model: str = "the model") -> ToolReader | None:
    """The reader of one call's output on ``engine``, or ``None`` for a plain call.

    Raises :class:`~fairagents.InvalidParameterError` when the engine cannot serve the
    spec: tools for a model whose engine renders none, a constraint for one that does
    not enforce constraints, or ``"auto"`` for a model without a tool parser.

    Examples:
        >>> from fairagents.tools import OutputSpec, output_reader
        >>> from fairagents.testing import FakeEngine
        >>> output_reader(FakeEngine(), OutputSpec()) is None
        True
        >>> output_reader(FakeEngine(), OutputSpec.of(response_format={"type": "json_object"})).spec.constraint()
        {'json_object': True}
    """
    if spec.plain:
        return None
    check_output(engine, spec, model)
    parser = engine.tool_parser(spec) if spec.calls_tools and spec.tool_choice == "auto" else None
    return spec.reader(parser)


def check_output(engine: Any, spec: OutputSpec, model: str = "the model") -> None:
    """Raise what :func:`output_reader` would for a model that cannot serve ``spec``, building nothing.

    ``engine`` is the model's engine (its capabilities): tools need a tool parser, a
    constraint needs structured outputs. A caller that prepares a prompt first asks
    this before the work (:meth:`fairagents.Arbiter.check_admission`).
    """
    if spec.tools and engine.tool_parser is None:
        raise InvalidParameterError(f"model {model!r} takes no tools", param="tools")
    if spec.constraint() is not None and not engine.structured_outputs:
        raise InvalidParameterError(
            f"model {model!r} cannot constrain its output (response_format, or tool_choice 'required' or a function)")


class _StringEscaper:
    r"""Escapes the raw control characters inside the strings of JSON text that arrives in pieces.

    Examples:
        >>> from fairagents.tools import _StringEscaper
        >>> escape = _StringEscaper()
        >>> escape('{"a": "x\x18') + escape('y\n"}\n')
        '{"a": "x\\u0018y\\n"}\n'
    """

    _SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}

    def __init__(self) -> None:
        self.in_string = False
        self.escaped = False

    def __call__(self, text: str) -> str:
        out = []
        for ch in text:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                elif ch < " ":
                    out.append(self._SHORT.get(ch) or f"\\u{ord(ch):04x}")
                    continue
            elif ch == '"':
                self.in_string = True
            out.append(ch)
        return "".join(out)


def tool_parser_for(name: str, tokenizer: Any, spec: OutputSpec) -> Any:
    """vLLM's tool parser ``name`` (``"hermes"``, ``"llama3_json"``, ``"mistral"`` …) for one call's tools.

    Raises :class:`~fairagents.InvalidParameterError` for a name vLLM does not know.
    """
    from vllm.tool_parsers import ToolParserManager

    try:
        parser_cls = ToolParserManager.get_tool_parser(name)
    except KeyError:
        raise InvalidParameterError(f"unknown tool parser {name!r}") from None
    return parser_cls(tokenizer, _parser_request(spec).tools)


def infer_tool_parser(chat_template: str | None, model_type: str | None = None) -> str | None:
    """The vLLM tool parser for a model, from the tool-call syntax its chat template writes, else its family.

    Examples:
        >>> from fairagents.tools import infer_tool_parser
        >>> infer_tool_parser("... <tool_call>{{ call | tojson }}</tool_call> ...")
        'hermes'
        >>> infer_tool_parser("{{ messages }}", "mistral")
        'mistral'
        >>> infer_tool_parser("{{ messages }}") is None
        True
    """
    template = chat_template or ""
    for marker, parser in _TEMPLATE_MARKERS:
        if marker in template:
            return parser
    return _FAMILIES.get((model_type or "").lower())


# The tool-call syntax a chat template writes, and the vLLM parser that reads it back.
_TEMPLATE_MARKERS = (
    ("<tool_call>", "hermes"),
    ("<|python_tag|>", "llama3_json"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|tool_call|>", "granite"),
    ("<function_call>", "granite-20b-fc"),
)
# Model families whose templates do not show their syntax plainly.
_FAMILIES = {"qwen2": "hermes", "qwen3": "hermes", "mistral": "mistral", "mixtral": "mistral",
             "granite": "granite", "internlm2": "internlm", "jamba": "jamba"}


def check_tool_parser(name: str) -> str:
    """``name`` if vLLM has a tool parser of that name; else :class:`~fairagents.InvalidParameterError` listing them."""
    from vllm.tool_parsers import ToolParserManager

    known = set(ToolParserManager.tool_parsers) | set(ToolParserManager.lazy_parsers)
    if name not in known:
        raise InvalidParameterError(f"unknown tool parser {name!r}; vLLM has: {', '.join(sorted(known))}")
    return name


def _parser_request(spec: OutputSpec) -> Any:
    """A vLLM ``ChatCompletionRequest`` carrying the spec's tools, as vLLM's tool parsers read them."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="fairagents", messages=[{"role": "user", "content": ""}],
                                 tools=list(spec.tools), tool_choice="auto")


def merge_pieces(pieces: Sequence[ToolCallDelta]) -> list[ToolCallDelta]:
    """Pieces of tool calls with one entry per call: those of one ``index`` merged, in order.

    A chunk of OpenAI's stream carries at most one entry per call; openai-python's older
    stream helper keeps the first entry of an index and mistakes the next for new arguments.

    Examples:
        >>> from fairagents.tools import ToolCallDelta, merge_pieces
        >>> merge_pieces([ToolCallDelta(0, id="call_1", name="f"), ToolCallDelta(0, arguments='{"a"'),
        ...               ToolCallDelta(1, id="call_2", name="g")])  # doctest: +NORMALIZE_WHITESPACE
        [ToolCallDelta(index=0, id='call_1', name='f', arguments='{"a"'),
         ToolCallDelta(index=1, id='call_2', name='g', arguments='')]
    """
    merged: dict[int, ToolCallDelta] = {}
    for piece in pieces:
        seen = merged.get(piece.index)
        merged[piece.index] = piece if seen is None else ToolCallDelta(
            piece.index, seen.id or piece.id, seen.name or piece.name, seen.arguments + piece.arguments)
    return list(merged.values())


def check_tool_replies(messages: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a ``tool`` message whose ``tool_call_id`` is no call of an earlier assistant message, as OpenAI does.

    Raises:
        InvalidParameterError: naming the message (OpenAI's wording).

    Examples:
        >>> from fairagents.tools import check_tool_replies
        >>> check_tool_replies([{"role": "tool", "tool_call_id": "call_1", "content": "12 C"}])
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.
    """
    calls: set[Any] = set()
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            calls.update(c.get("id") for c in message.get("tool_calls") or () if isinstance(c, Mapping))
        elif message.get("role") == "tool" and message.get("tool_call_id") not in calls:
            raise InvalidParameterError("Invalid parameter: messages with role 'tool' must be a response to a "
                                        "preceeding message with 'tool_calls'.", param=f"messages[{i}].role")


def _check_tools(tools: Sequence[Mapping[str, Any]] | None) -> tuple[dict[str, Any], ...]:
    if tools is None:
        return ()
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
        raise InvalidParameterError("tools must be a list of {'type': 'function', 'function': {...}} objects",
                                    param="tools")
    out, names = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(fn, Mapping):
            raise InvalidParameterError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                                        param=f"tools[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):  # match() lets a trailing "\n" pass "$"
            raise InvalidParameterError(f"tools[{i}].function.name must match [A-Za-z0-9_.-]{{1,64}}, got {name!r}",
                                        param=f"tools[{i}].function.name")
        if name in names:
            raise InvalidParameterError(f"tools[{i}]: the function name {name!r} is given twice",
                                        param=f"tools[{i}].function.name")
        names.add(name)
        parameters = fn.get("parameters")
        if parameters is not None and (not isinstance(parameters, Mapping)
                                       or parameters.get("type", "object") != "object"):
            raise InvalidParameterError(f"tools[{i}].function.parameters must be a JSON schema of an object",
                                        param=f"tools[{i}].function.parameters")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidParameterError(f"tools[{i}].function.description must be text",
                                        param=f"tools[{i}].function.description")
        function = {"name": name}
        if description is not None:
            function["description"] = description
        if parameters is not None:
            function["parameters"] = _json_copy(parameters, f"tools[{i}].function.parameters")
        if fn.get("strict") is not None:
            function["strict"] = bool(fn["strict"])
        out.append({"type": "function", "function": function})
    return tuple(out)


def _check_choice(choice: str | Mapping[str, Any] | None, tools: tuple[dict[str, Any], ...]) -> tuple[Any, str | None]:
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise InvalidParameterError(
                f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', ...}}, got {choice!r}",
                param="tool_choice")
        if choice == "required" and not tools:
            raise InvalidParameterError("tool_choice 'required' needs tools", param="tool_choice")
        return choice, None
    fn = choice.get("function") if isinstance(choice, Mapping) else None
    if not isinstance(choice, Mapping) or choice.get("type") != "function" or not isinstance(fn, Mapping):
        raise InvalidParameterError(f"tool_choice must name a function as {{'type': 'function', "
                                    f"'function': {{'name': ...}}}}, got {choice!r}", param="tool_choice")
    name = fn.get("name")
    if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:  # a list: unhashable
        raise InvalidParameterError(f"tool_choice names {name!r}, which is not one of the tools", param="tool_choice")
    return "function", name


def _check_response_format(fmt: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise InvalidParameterError(
            f"response_format must be {{'type': 'text' | 'json_object' | 'json_schema', ...}}, got {fmt!r}",
            param="response_format")
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise InvalidParameterError("response_format.json_schema must have a 'name' and a 'schema'",
                                    param="response_format.json_schema")
    if not isinstance(schema, Mapping):
        raise InvalidParameterError("response_format.json_schema.schema must be a JSON schema (an object)",
                                    param="response_format.json_schema.schema")
    return {"type": "json_schema", "json_schema": {"name": spec["name"],
                                                   "schema": _json_copy(schema, "response_format.json_schema.schema"),
                                                   "strict": bool(spec.get("strict", False))}}


def _json_copy(value: Any, param: str) -> Any:
    """``value`` copied as a JSON value: what JSON cannot carry (a set, NaN, a 5,000-digit integer) is refused."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise InvalidParameterError(f"{param} must be a JSON value: {err}", param=param) from None


def _parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    return dict(tool["function"].get("parameters") or {"type": "object", "properties": {}})


def _required_calls(text: str) -> list[tuple[str, str]] | None:
    """The ``[{"name", "parameters"}]`` array of a required call as (name, JSON arguments), or ``None``."""
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):  # cut short, or a number or nesting past what Python reads
        return None
    if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return None
    return [(i["name"], json.dumps(i.get("parameters", {}), ensure_ascii=False, separators=(",", ":"))) for i in items]
