"""Tool calling and structured output around the arbiter: the spec's checks, its constraints, and reading output.

The engine here is a FakeEngine scripted to answer as a model would; the real enforcement
in decoding is tested on vLLM in tests/engines/test_vllm_tools.py.
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.testing import FakeEngine
from fairagents.tools import OutputSpec, ToolCall, infer_tool_parser

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
MSG = [{"role": "user", "content": "weather in Oslo?"}]
CALL_TEXT = 'Let me look. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'


def arbiter(engine):
    arb = fa.Arbiter()
    arb.add_model("chat", engine)
    return arb, arb.app("a").agent("bot")


# -- the spec ------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tools": "weather"}, "tools must be a list"),
    ({"tools": [{"type": "function"}]}, "tools[0] must be"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "must match"),
    ({"tools": [{"type": "function", "function": {"name": "weather\n"}}]}, "must match"),
    ({"tools": [WEATHER, WEATHER]}, "given twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "JSON schema of an object"),
    ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice must be"),
    ({"tool_choice": "required"}, "needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "clock"}}}, "not one of the tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": ["weather"]}}}, "not one of the tools"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"response_format": {"type": "xml"}}, "response_format must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "'name'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": "x"}}}, "JSON schema"),
])
def test_malformed_tools_and_formats_are_typed_errors(kwargs, message):
    with pytest.raises(fa.InvalidParameterError, match=message.replace("[", r"\[")):
        OutputSpec.of(**kwargs)


def test_constraints_follow_the_choice():
    assert OutputSpec.of(tools=[WEATHER]).constraint() is None  # auto: the model may answer or call
    assert OutputSpec.of(response_format={"type": "text"}).plain
    named = OutputSpec.of(tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "clock"}})
    assert named.constraint() == {"json": {"type": "object", "properties": {}}}
    one = OutputSpec.of(tools=[WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False).constraint()["json"]
    assert one["maxItems"] == 1 and one["minItems"] == 1
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = OutputSpec.of(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert fmt.constraint() == {"json": schema}
    # a required call wins over a response format, as in vLLM's server
    both = OutputSpec.of(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    assert both.constraint()["json"]["type"] == "array"


def test_required_schema_is_the_one_vllms_server_builds():
    pytest.importorskip("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    defs_tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}}, "$defs": {"Item": {"type": "string"}}}}}
    for parallel in (True, False):
        tools = [WEATHER, CLOCK, defs_tool]
        ours = OutputSpec.of(tools=tools, tool_choice="required", parallel_tool_calls=parallel).constraint()["json"]
        theirs = get_json_schema_from_tools("required", [ChatCompletionToolsParam.model_validate(t) for t in tools],
                                            parallel)
        assert ours == theirs


@pytest.mark.parametrize("template,family,parser", [
    ("{% for t in tools %}<tool_call>{% endfor %}", None, "hermes"),
    ("<|python_tag|>{{ x }}", None, "llama3_json"),
    ("{{ messages }}", "qwen2", "hermes"),
    ("{{ messages }}", "gpt2", None),
])
def test_the_tool_parser_follows_the_template_then_the_family(template, family, parser):
    assert infer_tool_parser(template, family) == parser


# -- reading output --------------------------------------------------------------------


AUTO = [
    'Sure. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    '<tool_call>{"name": "clock", "arguments": {}}</tool_call>',
    '<tool_call>{"name":"weather","arguments":{"city":"Oslo"}}</tool_call>',  # compact: the parser re-spaces it
    'Hm. <tool_call>{"name": "weather", "arguments": {"city": "Os',  # cut short by max_tokens
    'Hm. <tool_call>{"name": "weather", "arguments": {city: Oslo}}</tool_call>',  # not JSON
    'A <tool_call>{"name": "clock", "arguments": {}}</tool_call> and after',  # content after the call
    'No call at all, just <tool words.',
    '',
]
REQUIRED = ['[{"name": "weather", "parameters": {"city": "Oslo"}}]', '[{"name": "weather", "parame', '']
NAMED = ['{"city": "Oslo"}', '{"city": "Os',
         '\n \t{\n  "city" :\t"Oslo" \r\n}\n\n',  # a permissive grammar's padding, around and inside the value
         '\n\n\t']  # padding until max_tokens, before the value began


def _stream(reader, text, cuts):
    """Feed ``text`` cut by ``cuts`` and flush: the content and the calls (id, name, arguments) a client rebuilds."""
    content, calls, pos, i = [], {}, 0, 0
    while pos < len(text):
        cut = cuts[i % len(cuts)]
        i += 1
        piece, deltas = reader.feed(text[pos:pos + cut])
        pos += cut
        content.append(piece)
        for d in deltas:
            calls.setdefault(d.index, []).append(d)
    piece, deltas = reader.flush()
    content.append(piece)
    for d in deltas:
        calls.setdefault(d.index, []).append(d)
    rebuilt = [(next(d.id for d in ds if d.id), next(d.name for d in ds if d.name), "".join(d.arguments for d in ds))
               for _, ds in sorted(calls.items())]
    return "".join(content), rebuilt


@settings(deadline=None)  # the first example imports vLLM's parsers
@given(st.sampled_from(["auto", "required", "named"]), st.data(),
       st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=30))
def test_a_stream_adds_up_to_the_reply_whatever_the_model_wrote(mode, data, cuts):
    """However the output is cut into pieces, and whether its calls are whole, compact, cut short or
    not JSON at all, the streamed content and deltas rebuild exactly what a reply reads (content, calls)."""
    pytest.importorskip("vllm")
    if mode == "auto":
        spec = OutputSpec.of(tools=[WEATHER, CLOCK])
        make = lambda: spec.reader(FakeEngine().tool_parser(spec))  # noqa: E731
        text = data.draw(st.sampled_from(AUTO))
    elif mode == "required":
        spec = OutputSpec.of(tools=[WEATHER, CLOCK], tool_choice="required")
        make, text = spec.reader, data.draw(st.sampled_from(REQUIRED))
    else:
        spec = OutputSpec.of(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "weather"}})
        make, text = spec.reader, data.draw(st.sampled_from(NAMED))
    reader = make()
    content, calls = _stream(reader, text, cuts)
    streamed_content, streamed_calls = reader.finish()
    assert calls == [(c.id, c.name, c.arguments) for c in streamed_calls]  # ids as the stream sent them
    reply_content, reply_calls = make().finish(text)  # what a call without streaming gets
    assert content == (reply_content or "") == (streamed_content or "")
    assert [(c.name, c.arguments) for c in reply_calls] == [(name, args) for _, name, args in calls]


@settings(deadline=None)
@given(st.sampled_from(NAMED), st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=30))
def test_a_named_calls_argument_pieces_start_the_json_value_and_none_is_whitespace_alone(text, cuts):
    """Clients that parse a call's arguments so far after every piece (openai's stream helper) need a first
    piece that starts the JSON value and no piece of whitespace alone, however the model padded its JSON."""
    spec = OutputSpec.of(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "weather"}})
    reader = spec.reader()
    pieces, pos, i = [], 0, 0
    while pos < len(text):
        pieces += [d.arguments for d in reader.feed(text[pos:pos + cuts[i % len(cuts)]])[1]]
        pos, i = pos + cuts[i % len(cuts)], i + 1
    pieces += [d.arguments for d in reader.flush()[1]]
    sent = [p for p in pieces if p]
    assert all(p.strip() for p in sent)
    assert not sent or sent[0][0] not in " \t\r\n"
    assert "".join(sent) == text.strip() == reader.finish()[1][0].arguments


def test_what_the_model_wrote_is_read_as_calls_or_as_content():
    pytest.importorskip("vllm")
    spec = OutputSpec.of(tools=[WEATHER, CLOCK])
    read = [spec.reader(FakeEngine().tool_parser(spec)).finish(text) for text in AUTO]
    assert [[c.name for c in calls] for _, calls in read] == [["weather", "clock"], ["weather"], [], [], ["clock"],
                                                              [], []]
    assert read[1][1][0].arguments == '{"city": "Oslo"}'
    assert [content for content, _ in read[2:4]] == AUTO[2:4]  # a call cut short, or not JSON, is content


def test_a_required_call_cut_short_comes_back_as_text():
    reader = OutputSpec.of(tools=[WEATHER], tool_choice="required").reader()
    reader.feed('[{"name": "weather", "parame')
    assert reader.finish() == ('[{"name": "weather", "parame', [])


# -- through the arbiter ------------------------------------------------------------------


async def test_auto_tool_call_comes_back_as_calls_with_the_tools_rendered():
    pytest.importorskip("vllm")
    engine = FakeEngine(reply=CALL_TEXT)
    arb, bot = arbiter(engine)
    async with arb:
        reply = await bot.chat("chat", MSG, tools=[WEATHER])
    assert reply.finish_reason == "tool_calls"
    assert reply.text.strip() == "Let me look."
    [call] = reply.tool_calls
    assert (call.name, call.parsed_arguments()) == ("weather", {"city": "Oslo"})
    assert call.id.startswith("call_")
    assert engine.tools == [[WEATHER]]  # the chat template was given the tools


async def test_stream_with_tools_ends_with_tool_calls():
    pytest.importorskip("vllm")
    arb, bot = arbiter(FakeEngine(reply=CALL_TEXT))
    async with arb:
        deltas = [d async for d in bot.stream_chat("chat", MSG, tools=[WEATHER])]
        reply = await bot.chat("chat", MSG, tools=[WEATHER])
    assert deltas[-1].finish_reason == "tool_calls"
    pieces = [t for d in deltas for t in d.tool_calls]
    assert pieces[0].name == "weather" and pieces[0].id.startswith("call_")
    assert json.loads("".join(p.arguments for p in pieces)) == {"city": "Oslo"}
    assert "".join(d.text for d in deltas).strip() == reply.text.strip()
    assert sum(d.new_tokens for d in deltas) == reply.usage.completion_tokens


@pytest.mark.parametrize(("text", "choice", "max_tokens"), [
    (AUTO[1], "auto", None), (AUTO[2], "auto", None), (AUTO[3], "auto", None), (CALL_TEXT, "auto", 4),
    (REQUIRED[0], "required", None), (REQUIRED[0], "required", 2),
])
async def test_through_the_arbiter_a_stream_adds_up_to_the_reply(text, choice, max_tokens):
    """Content, calls and finish reason alike, for whole, compact, malformed and cut-short calls."""
    pytest.importorskip("vllm")
    arb, bot = arbiter(FakeEngine(reply=text))
    kwargs = {"tools": [WEATHER, CLOCK], "tool_choice": choice, "max_tokens": max_tokens}
    async with arb:
        reply = await bot.chat("chat", MSG, **kwargs)
        deltas = [d async for d in bot.stream_chat("chat", MSG, **kwargs)]
    calls = {}
    for piece in (p for d in deltas for p in d.tool_calls):
        call = calls.setdefault(piece.index, {"name": None, "arguments": ""})
        call["name"] = call["name"] or piece.name
        call["arguments"] += piece.arguments
    assert "".join(d.text for d in deltas) == reply.text
    assert [(c["name"], c["arguments"]) for _, c in sorted(calls.items())] == \
        [(c.name, c.arguments) for c in reply.tool_calls]
    assert deltas[-1].finish_reason == reply.finish_reason
    if max_tokens is not None:  # cut short: what came back is text, in the stream too
        assert reply.finish_reason == "length" and not reply.tool_calls and reply.text


async def test_required_and_named_calls_send_the_constraint_and_read_json():
    engine = FakeEngine(reply=lambda params: (
        '[{"name": "weather", "parameters": {"city": "Oslo"}}, {"name": "clock", "parameters": {}}]'
        if params.structured["json"]["type"] == "array" else '{"city": "Bergen"}'))
    arb, bot = arbiter(engine)
    async with arb:
        required = await bot.chat("chat", MSG, tools=[WEATHER, CLOCK], tool_choice="required")
        named = await bot.chat("chat", MSG, tools=[WEATHER, CLOCK],
                               tool_choice={"type": "function", "function": {"name": "weather"}})
    assert [(c.name, c.parsed_arguments()) for c in required.tool_calls] == [("weather", {"city": "Oslo"}),
                                                                               ("clock", {})]
    assert required.text == "" and required.finish_reason == "tool_calls"
    assert [(c.name, c.parsed_arguments()) for c in named.tool_calls] == [("weather", {"city": "Bergen"})]
    sent = list(engine.params.values())
    assert sent[0].structured["json"]["items"]["anyOf"][1]["properties"]["name"]["enum"] == ["clock"]
    assert sent[1].structured == {"json": WEATHER["function"]["parameters"]}


async def test_json_response_format_is_a_constraint_and_reply_json_reads_it():
    engine = FakeEngine(reply='{"answer": "yes"}')
    arb, bot = arbiter(engine)
    async with arb:
        reply = await bot.chat("chat", MSG, response_format={"type": "json_object"})
    assert reply.json() == {"answer": "yes"} and reply.finish_reason == "stop" and not reply.tool_calls
    assert next(iter(engine.params.values())).structured == {"json_object": True}


async def test_tool_history_is_accepted_and_tool_choice_none_calls_nothing():
    pytest.importorskip("vllm")
    engine = FakeEngine(reply=CALL_TEXT)
    arb, bot = arbiter(engine)
    history = [*MSG, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    async with arb:
        reply = await bot.chat("chat", history, tools=[WEATHER], tool_choice="none")
    assert reply.tool_calls == () and "<tool_call>" in reply.text  # none: the text is the text


@pytest.mark.parametrize("messages", [
    [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}],
    [{"role": "user", "content": "x", "tool_calls": []}],
    [{"role": "assistant", "tool_calls": "f"}],
    [{"role": "tool"}],
])
async def test_malformed_tool_history_is_bad_input_and_costs_nothing(messages):
    arb, bot = arbiter(FakeEngine())
    async with arb:
        with pytest.raises(fa.InvalidParameterError):
            await bot.chat("chat", messages, tools=[WEATHER])
        assert arb.stats().apps == {} or arb.stats().apps["a"].service == 0


async def test_an_engine_without_tools_or_constraints_refuses_them_before_queueing():
    class Plain(FakeEngine):
        tool_parser = None
        structured_outputs = False

    arb, bot = arbiter(Plain())
    async with arb:
        with pytest.raises(fa.InvalidParameterError, match="takes no tools"):
            await bot.chat("chat", MSG, tools=[WEATHER])
        with pytest.raises(fa.InvalidParameterError, match="cannot constrain"):
            await bot.chat("chat", MSG, response_format={"type": "json_object"})
        assert arb.queued() == 0


def test_tool_call_round_trips_as_an_openai_message_item():
    call = ToolCall("call_1", "weather", '{"city": "Oslo"}')
    assert call.as_openai() == {"id": "call_1", "type": "function",
                                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}


def _tokenizer(*specials):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{s: i + 1 for i, s in enumerate(specials)}}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")))
    tokenizer.add_special_tokens({"additional_special_tokens": list(specials)})
    return tokenizer


@settings(deadline=None)
@given(st.sampled_from([
    ("llama3_json", ' {"name": "weather", "parameters": {"city": "Oslo"}}'),  # streamed as content, read as a call
    ("llama3_json", 'Nothing to call.'),
    ("mistral", '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]'),
    ("granite", 'ok <|tool_call|>[{"name": "weather", "arguments": {"city": "Oslo"}}]'),
]), st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=20))
def test_with_other_tool_parsers_a_stream_adds_up_to_the_reply_too(case, cuts):
    """Parsers whose streamed content can differ from what they read in the whole output hold it back to the end."""
    pytest.importorskip("vllm")
    from fairagents.tools import tool_parser_for

    name, text = case
    tokenizer = _tokenizer("<|python_tag|>", "[TOOL_CALLS]", "<|tool_call|>")
    spec = OutputSpec.of(tools=[WEATHER, CLOCK])
    reader = spec.reader(tool_parser_for(name, tokenizer, spec))
    content, calls = _stream(reader, text, cuts)
    reply_content, reply_calls = spec.reader(tool_parser_for(name, tokenizer, spec)).finish(text)
    assert content == (reply_content or "")
    assert [(name, args) for _, name, args in calls] == [(c.name, c.arguments) for c in reply_calls]
