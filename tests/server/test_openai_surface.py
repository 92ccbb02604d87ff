"""The OpenAI surface over HTTP on FakeEngines: tools, structured output, n, logprobs, penalties, max_tokens, images.

The engines are test doubles scripted to answer as a model would; what vLLM enforces in
decoding (a required call, a JSON schema, a logit bias) is checked on the real engine
in test_real.py.
"""

import asyncio
import dataclasses
import json

import httpx
import openai
import pytest
from openai.types import Completion, ImagesResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

import fairagents as fa
from fairagents.reply import TokenLogprob
from fairagents.testing import FakeEngine

from ._support import KEYS, MSG, FakePainter, client, live, make_config

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "weather in Oslo?"}]
CALL_TEXT = 'Let me look. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
AUTH = {"Authorization": f"Bearer {KEYS['driving']}"}


class Recording(FakeEngine):
    """A FakeEngine that keeps the messages of every chat prompt it renders."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.messages = []

    def prepare_chat(self, messages, tools=None):
        self.messages.append([dict(m) for m in messages])
        return super().prepare_chat(messages, tools)


class Scoring(FakeEngine):
    """A FakeEngine that reports log probabilities: word ``i`` of a reply has logprob ``-i/10``, and alternatives."""

    async def generate(self, request_id, prompt, params):
        produced = 0
        async for delta in super().generate(request_id, prompt, params):
            if params.logprobs is not None and delta.new_tokens:
                tokens = []
                for _ in range(delta.new_tokens):
                    value = -produced / 10
                    top = tuple(TokenLogprob(f"alt{k}", value - k) for k in range(params.logprobs))
                    tokens.append(TokenLogprob(delta.text, value, top=top))
                    produced += 1
                delta = dataclasses.replace(delta, logprobs=tuple(tokens))
            yield delta


def serve(engine, in_flight=4, **arbiter_kw):
    arbiter = fa.Arbiter(in_flight=in_flight, drain_timeout=1.0, **arbiter_kw)
    arbiter.add_model("chat", engine)
    return arbiter


def nothing_charged(arbiter, engine):
    assert engine.started_order == [] and not arbiter.ledger.charges and not arbiter.ledger.records


async def sse_chunks(url, body):
    """The chunks of a streamed request, as raw JSON objects."""
    chunks = []
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as http:
        async with http.stream("POST", "/v1/chat/completions" if "messages" in body else "/v1/completions",
                               json={**body, "stream": True}) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


# -- tools -------------------------------------------------------------------------------


async def test_a_tool_call_round_trip_through_the_openai_client():
    replies = iter([CALL_TEXT, "It rains in Oslo."])
    engine = Recording(reply=lambda params: next(replies))
    arbiter = serve(engine)
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        first = await c.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER, CLOCK])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        assert (call.function.name, json.loads(call.function.arguments)) == ("weather", {"city": "Oslo"})
        assert choice.message.content == "Let me look. "

        history = [*ASK, choice.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "rain, 7 °C"}]
        second = await c.chat.completions.create(model="chat", messages=history, tools=[WEATHER, CLOCK])
    assert second.choices[0].finish_reason == "stop" and second.choices[0].message.content == "It rains in Oslo."
    assert second.choices[0].message.tool_calls is None
    sent = engine.messages[1]
    assert sent[1]["role"] == "assistant" and sent[1]["tool_calls"][0]["id"] == call.id
    assert sent[1]["tool_calls"][0]["function"] == {"name": "weather", "arguments": call.function.arguments}
    assert sent[2] == {"role": "tool", "content": "rain, 7 °C", "tool_call_id": call.id}
    assert engine.tools == [[WEATHER, CLOCK]] * 2  # the template rendered the tools into both prompts
    assert arbiter.stats().agents["driving/default"].done == 2


async def test_a_reply_of_only_tool_calls_has_null_content():
    engine = FakeEngine(reply='<tool_call>{"name": "clock", "arguments": {}}</tool_call>')
    async with live(serve(engine), make_config()) as (url, _), httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        body = (await http.post("/v1/chat/completions", json={"model": "chat", "messages": ASK, "tools": [CLOCK]})).json()
    message = body["choices"][0]["message"]
    assert message["content"] is None and message["tool_calls"][0]["function"] == {"name": "clock", "arguments": "{}"}
    assert ChatCompletion.model_validate(body).choices[0].finish_reason == "tool_calls"


NAMED = {"type": "function", "function": {"name": "weather"}}
REQUIRED_TEXT = '[{"name": "weather", "parameters": {"city": "Oslo"}}]'


@pytest.mark.parametrize(("choice", "text"), [
    ("auto", CALL_TEXT), ("required", REQUIRED_TEXT), (NAMED, '{"city": "Oslo"}')], ids=["auto", "required", "named"])
async def test_streamed_tool_calls_add_up_to_the_non_streamed_ones(choice, text):
    engine = FakeEngine(reply=text)
    request = {"model": "chat", "messages": ASK, "tools": [WEATHER, CLOCK], "tool_choice": choice}
    async with live(serve(engine), make_config()) as (url, _), client(url) as c:
        whole = (await c.chat.completions.create(**request)).choices[0]
        async with c.chat.completions.stream(**request) as stream:
            streamed = (await stream.get_final_completion()).choices[0]
        chunks = await sse_chunks(url, request)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    assert streamed.finish_reason == whole.finish_reason == "tool_calls"
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in whole.message.tool_calls]
    assert calls == [(t.function.name, json.loads(t.function.arguments)) for t in streamed.message.tool_calls]
    assert calls == [("weather", {"city": "Oslo"})]
    assert (streamed.message.content or "") == (whole.message.content or "")
    pieces = [t for c in chunks for t in c["choices"][0]["delta"].get("tool_calls", [])] if chunks else []
    assert pieces[0]["id"] and pieces[0]["type"] == "function" and pieces[0]["function"]["name"] == "weather"
    assert all("id" not in p and "name" not in p["function"] for p in pieces[1:])
    constraints = [engine.params[r].structured for r in engine.started_order]
    assert all((c is None) == (choice == "auto") for c in constraints) and len(constraints) == 3


async def test_a_response_format_reaches_the_engine_as_a_constraint():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    engine = FakeEngine(reply=lambda params: json.dumps({"city": "Oslo"}) if params.structured else "no")
    async with live(serve(engine), make_config()) as (url, _), client(url) as c:
        reply = await c.chat.completions.create(model="chat", messages=ASK, response_format={
            "type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
        loose = await c.chat.completions.create(model="chat", messages=ASK, response_format={"type": "json_object"})
        text = await c.chat.completions.create(model="chat", messages=ASK, response_format={"type": "text"})
    assert json.loads(reply.choices[0].message.content) == {"city": "Oslo"}
    first, second, third = (engine.params[r] for r in engine.started_order)
    assert first.structured == {"json": schema} and second.structured == {"json_object": True}
    assert third.structured is None and text.choices[0].message.content == "no"
    assert loose.choices[0].finish_reason == "stop"


BAD_TOOLS = [
    ({"tools": [WEATHER, WEATHER]}, "given twice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "clock"}}}, "not one of the tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, "JSON schema"),
    ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice must be"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": {
        "type": "object", "$defs": {"p": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "b", "parameters": {
            "type": "object", "$defs": {"p": {"type": "integer"}}}}}], "tool_choice": "required"}, "differently"),
]


async def test_bad_tools_and_formats_are_400s_and_nothing_is_charged():
    engine = FakeEngine(reply=CALL_TEXT)
    arbiter = serve(engine)
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        before = (await http.get("/v1/fairness")).json()["apps"]
        for fields, message in BAD_TOOLS:
            for stream in (False, True):
                response = await http.post("/v1/chat/completions",
                                           json={"model": "chat", "messages": ASK, "stream": stream, **fields})
                assert response.status_code == 400, (fields, response.text)
                error = response.json()["error"]
                assert error["type"] == "invalid_request_error" and error["code"] == "invalid_parameter"
                assert message in error["message"], (fields, error)
        after = (await http.get("/v1/fairness")).json()["apps"]
        async with client(url) as c:
            with pytest.raises(openai.BadRequestError):
                await c.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER], tool_choice="any")
    nothing_charged(arbiter, engine)
    assert [a["service"] for a in after.values()] == [a["service"] for a in before.values()] == [0, 0]


async def test_tools_for_a_model_that_takes_none_are_refused_before_tokenizing():
    class Plain(FakeEngine):
        tool_parser = None
        structured_outputs = False

    engine = Recording()
    arbiter = fa.Arbiter(drain_timeout=1.0)
    arbiter.add_model("chat", engine)
    arbiter.add_model("plain", Plain())
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        for fields, message in [({"tools": [WEATHER]}, "takes no tools"),
                                ({"response_format": {"type": "json_object"}}, "cannot constrain its output")]:
            response = await http.post("/v1/chat/completions", json={"model": "plain", "messages": ASK, **fields})
            assert response.status_code == 400 and message in response.json()["error"]["message"]
    assert not arbiter.ledger.charges and arbiter.engine("plain").started_order == []


# -- n choices ---------------------------------------------------------------------------


async def test_n_choices_are_n_requests_each_charged_and_scheduled():
    engine = FakeEngine(tokens_per_reply=3)
    arbiter = serve(engine)
    async with live(arbiter, make_config()) as (url, _), client(url, agent="planner") as c:
        reply = await c.chat.completions.create(model="chat", messages=MSG, n=2, max_tokens=8)
        text = await c.completions.create(model="chat", prompt="once upon", n=3, max_tokens=2)
    assert [ch.index for ch in reply.choices] == [0, 1]
    assert all(ch.message.content == "t0 t1 t2 " and ch.finish_reason == "stop" for ch in reply.choices)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 6)  # the prompt once, as OpenAI counts
    assert reply.usage.model_extra["unified_tokens"] == 2 * (3 + 2 * 3)  # each choice charged its prompt and output
    assert [ch.index for ch in text.choices] == [0, 1, 2] and text.usage.completion_tokens == 6
    records = arbiter.ledger.records
    assert len(records) == 5 and {(r.app, r.agent) for r in records} == {("driving", "planner")}
    assert arbiter.stats().agents["driving/planner"].done == 5
    assert arbiter.ledger.service_of("driving") == 2 * 9 + 3 * (3 + 2 * 2)


async def test_streamed_choices_interleave_by_index_even_when_they_run_one_after_another():
    engine = FakeEngine(tokens_per_reply=4, token_time=0.001)
    arbiter = serve(engine, in_flight=1)  # choice 1 waits for choice 0's slot: nothing may wait on the client
    async with live(arbiter, make_config()) as (url, _):
        chunks = await sse_chunks(url, {"model": "chat", "messages": MSG, "n": 2, "max_tokens": 8,
                                        "stream_options": {"include_usage": True}})
        async with client(url) as c:
            async with c.chat.completions.stream(model="chat", messages=MSG, n=3, max_tokens=8) as stream:
                final = await stream.get_final_completion()
    *pieces, usage = chunks
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    texts = {0: "", 1: ""}
    for chunk in pieces:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["delta"].get("content") or ""
    assert texts == {0: "t0 t1 t2 t3 ", 1: "t0 t1 t2 t3 "}
    assert [c["choices"][0]["finish_reason"] for c in pieces if c["choices"][0]["finish_reason"]] == ["stop", "stop"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    assert [(ch.index, ch.message.content) for ch in final.choices] == [(i, "t0 t1 t2 t3 ") for i in range(3)]
    assert engine.max_running == 1 and len(arbiter.ledger.records) == 5


async def test_a_client_that_leaves_a_stream_of_choices_cancels_them_all():
    engine = FakeEngine(tokens_per_reply=1000, token_time=0.005)
    arbiter = serve(engine)
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        stream = await c.chat.completions.create(model="chat", messages=MSG, n=2, max_tokens=500, stream=True)
        received = 0
        async for chunk in stream:
            received += bool(chunk.choices[0].delta.content)
            if received == 6:
                break
        await stream.close()
        for _ in range(400):
            if len(arbiter.ledger.records) == 2:
                break
            await asyncio.sleep(0.005)
    records = arbiter.ledger.records
    assert [r.outcome for r in records] == [fa.Outcome.CANCELLED] * 2
    assert all(r.output_tokens < 200 for r in records) and not engine.running


async def test_a_choice_refused_before_the_answer_fails_the_request_and_the_others_leave_the_queue():
    engine = FakeEngine(manual=True)
    arbiter = serve(engine, in_flight=1)
    config = make_config(apps={"driving": {"api_key": KEYS["driving"], "max_queued": 2},
                               "studio": {"api_key": KEYS["studio"]}})
    async with live(arbiter, config) as (url, _), httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        async with client(url, KEYS["studio"]) as studio:  # holds the only slot
            blocker = asyncio.create_task(studio.chat.completions.create(model="chat", messages=MSG, max_tokens=1))
            while not engine.running:
                await asyncio.sleep(0.005)
            for stream in (False, True):  # two choices queue, the third is past the bound
                response = await http.post("/v1/chat/completions",
                                           json={"model": "chat", "messages": MSG, "n": 3, "stream": stream})
                assert response.status_code == 429 and response.json()["error"]["code"] == "queue_full"
                await asyncio.sleep(0.01)
                assert arbiter.stats().apps["driving"].queued == 0
            engine.emit(next(iter(engine.running)), 1, "stop")
            await blocker
    assert arbiter.ledger.service_of("driving") == 0 and len(engine.started_order) == 1


# -- logprobs, penalties, logit bias -------------------------------------------------------


async def test_logprobs_have_openais_shape_whole_and_streamed():
    engine = Scoring(tokens_per_reply=3)
    request = {"model": "chat", "messages": MSG, "logprobs": True, "top_logprobs": 2, "max_tokens": 8}
    async with live(serve(engine), make_config()) as (url, _), httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        body = (await http.post("/v1/chat/completions", json=request)).json()
        plain = (await http.post("/v1/chat/completions", json={**request, "logprobs": False, "top_logprobs": None})).json()
        chunks = await sse_chunks(url, request)
        text = (await http.post("/v1/completions", json={"model": "chat", "prompt": "a b", "logprobs": 1})).json()
        streamed_text = await sse_chunks(url, {"model": "chat", "prompt": "a b", "logprobs": 1})
    content = ChatCompletion.model_validate(body).choices[0].logprobs.content
    assert [(t.token, t.logprob) for t in content] == [("t0 ", 0.0), ("t1 ", -0.1), ("t2 ", -0.2)]
    assert [(a.token, a.logprob) for a in content[1].top_logprobs] == [("alt0", -0.1), ("alt1", -1.1)]
    assert content[0].bytes == list(b"t0 ") and plain["choices"][0]["logprobs"] is None
    streamed = [t for c in chunks for t in ((c["choices"][0]["logprobs"] or {}).get("content") or [])]
    assert streamed == [t.model_dump() for t in content]
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    legacy = Completion.model_validate(text).choices[0].logprobs
    assert legacy.tokens == ["t0 ", "t1 ", "t2 "] and legacy.text_offset == [0, 3, 6]
    assert legacy.token_logprobs == [0.0, -0.1, -0.2] and legacy.top_logprobs == [{"alt0": 0.0}, {"alt0": -0.1},
                                                                                  {"alt0": -0.2}]
    offsets = [o for c in streamed_text if c["choices"] for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 3, 6]


async def test_penalties_logit_bias_and_logprobs_reach_the_engine():
    engine = FakeEngine(tokens_per_reply=2)
    async with live(serve(engine), make_config()) as (url, _), client(url) as c:
        await c.chat.completions.create(model="chat", messages=MSG, max_tokens=4, presence_penalty=0.5,
                                        frequency_penalty=-1.25, logit_bias={"17": 100, "3": -100}, logprobs=True,
                                        top_logprobs=5)
        await c.completions.create(model="chat", prompt="a", max_tokens=4, presence_penalty=2, logit_bias={"9": 1},
                                   logprobs=0)
        await c.chat.completions.create(model="chat", messages=MSG, max_tokens=4)
    chat, text, plain = (engine.params[r] for r in engine.started_order)
    assert (chat.presence_penalty, chat.frequency_penalty, chat.logit_bias, chat.logprobs) == (
        0.5, -1.25, ((3, -100.0), (17, 100.0)), 5)
    assert (text.presence_penalty, text.logit_bias, text.logprobs) == (2.0, ((9, 1.0),), 0)
    assert (plain.presence_penalty, plain.frequency_penalty, plain.logit_bias, plain.logprobs) == (0.0, 0.0, (), None)
    assert plain.repetition_penalty == 1.0


async def test_vllms_benchmark_clients_completion_request_is_served_as_vllm_serves_it():
    """``vllm bench serve``'s completions payload: vLLM's ``repetition_penalty`` and ``ignore_eos`` extensions."""
    engine = FakeEngine(tokens_per_reply=2)
    payload = {"model": "chat", "prompt": "a b c", "repetition_penalty": 1.0, "max_tokens": 4, "logprobs": None,
               "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    async with live(serve(engine), make_config()) as (url, _), httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        chunks = await sse_chunks(url, payload)
        penalised = (await http.post("/v1/completions", json={**payload, "stream": False,
                                                              "repetition_penalty": 1.3})).json()
        refused = await http.post("/v1/completions", json={**payload, "repetition_penalty": 0})
    assert chunks[-1]["usage"]["completion_tokens"] == penalised["usage"]["completion_tokens"] == 2  # its reply
    first, second = (engine.params[r] for r in engine.started_order)
    assert (first.repetition_penalty, first.ignore_eos, second.repetition_penalty) == (1.0, True, 1.3)
    assert refused.status_code == 400 and "repetition_penalty" in refused.text


# -- max_tokens -----------------------------------------------------------------------------


async def test_one_max_tokens_rule_for_chat_completions_and_the_python_api():
    """Unset, max_tokens is the rest of the context (within the token budget), on every path."""
    engine = FakeEngine(max_model_len=50, tokens_per_reply=1000)
    arbiter = serve(engine)
    notebook = arbiter.app("notebook").agent("cell")
    async with live(arbiter, make_config()) as (url, _), client(url) as c:
        chat = await c.chat.completions.create(model="chat", messages=MSG)
        text = await c.completions.create(model="chat", prompt="once upon a time")
        in_process = await notebook.chat("chat", MSG)
        streamed = [d async for d in notebook.stream_complete("chat", "once upon a time")]
    assert chat.usage.completion_tokens == in_process.usage.completion_tokens == 50 - 3
    assert text.usage.completion_tokens == sum(d.new_tokens for d in streamed) == 50 - 5
    assert chat.choices[0].finish_reason == in_process.finish_reason == "length"
    assert [engine.params[r].max_tokens for r in engine.started_order] == [47, 45, 47, 45]


# -- images, models ---------------------------------------------------------------------------


async def test_image_usage_validates_as_openais_images_response():
    arbiter = fa.Arbiter(drain_timeout=1.0)
    arbiter.add_model("painter", FakePainter())
    async with live(arbiter, make_config()) as (url, _), httpx.AsyncClient(base_url=url, headers=AUTH) as http:
        body = (await http.post("/v1/images/generations", json={"prompt": "a red car", "n": 2, "size": "16x16"})).json()
    usage = ImagesResponse.model_validate(body).usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (4, 2 * 2 * 2 * 2, 4 + 16)
    assert (usage.input_tokens_details.text_tokens, usage.input_tokens_details.image_tokens) == (4, 0)
    assert usage.output_tokens_details.image_tokens == 16
    assert body["usage"]["unified_tokens"] > 0 and body["usage"]["completion_tokens"] == 16


async def test_a_model_card_and_a_404_for_an_unknown_model():
    async with live(serve(FakeEngine(max_model_len=321)), make_config()) as (url, _), client(url) as c:
        card = await c.models.retrieve("chat")
        with pytest.raises(openai.NotFoundError) as missing:
            await c.models.retrieve("gpt-9")
    assert (card.id, card.object, card.owned_by, card.model_extra["max_model_len"]) == ("chat", "model", "fairagents", 321)
    assert missing.value.body["code"] == "model_not_found" and "gpt-9" in missing.value.body["message"]
