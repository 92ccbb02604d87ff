"""Tool calling and structured output on a real vLLM engine (the embedded random-weight model).

The model never learned to call a tool: what makes its calls valid is vLLM's structured
outputs, which the arbiter asks for under ``tool_choice="required"``, a named function
and a JSON response format.
"""

import asyncio
import json
import time
import uuid

import jsonschema
import pytest

import fairagents as fa
from tests.engines.test_vllm import Shared

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
        "additionalProperties": False}
ZONE = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather of a city", "parameters": CITY}},
         {"type": "function", "function": {"name": "clock", "parameters": ZONE}}]
SCHEMAS = {"weather": CITY, "clock": ZONE}
MSG = [{"role": "user", "content": "what is the weather in Oslo?"}]
ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
          "required": ["answer", "n"], "additionalProperties": False}


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_required_call_is_a_valid_call_of_a_given_tool(text_engine, seed):
    async with Shared(text_engine) as arbiter:
        bot = arbiter.app("a").agent("bot")
        reply = await bot.chat("chat", MSG, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                               max_tokens=400, seed=seed)
    assert reply.finish_reason == "tool_calls", reply
    [call] = reply.tool_calls  # parallel_tool_calls=False: one item at most, enforced
    jsonschema.validate(call.parsed_arguments(), SCHEMAS[call.name])
    assert reply.text == ""


async def test_a_named_function_is_called_with_valid_arguments(text_engine):
    async with Shared(text_engine) as arbiter:
        bot = arbiter.app("a").agent("bot")
        reply = await bot.chat("chat", MSG, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "clock"}},
                               max_tokens=400, seed=4)
    [call] = reply.tool_calls
    assert call.name == "clock" and reply.finish_reason == "tool_calls"
    jsonschema.validate(call.parsed_arguments(), ZONE)


async def test_a_json_schema_response_format_is_met(text_engine):
    async with Shared(text_engine) as arbiter:
        bot = arbiter.app("a").agent("bot")
        reply = await bot.chat("chat", MSG, max_tokens=400, seed=5,
                               response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}})
        anything = await bot.chat("chat", MSG, max_tokens=400, seed=5, response_format={"type": "json_object"})
    assert reply.finish_reason == "stop"
    jsonschema.validate(reply.json(), ANSWER)
    assert anything.finish_reason == "length" or isinstance(anything.json(), dict)


async def test_a_streamed_required_call_adds_up_to_the_call(text_engine):
    async with Shared(text_engine) as arbiter:
        bot = arbiter.app("a").agent("bot")
        deltas = [d async for d in bot.stream_chat("chat", MSG, tools=TOOLS, tool_choice="required",
                                                   parallel_tool_calls=False, max_tokens=400, seed=1)]
    assert deltas[-1].finish_reason == "tool_calls"
    pieces = [p for d in deltas for p in d.tool_calls]
    assert pieces[0].id and pieces[0].name in SCHEMAS
    jsonschema.validate(json.loads("".join(p.arguments for p in pieces)), SCHEMAS[pieces[0].name])


async def test_the_template_renders_the_tools_into_the_prompt(text_engine):
    async with Shared(text_engine) as arbiter:
        bot = arbiter.app("a").agent("bot")
        plain = await bot.chat("chat", MSG, max_tokens=1)
        offered = await bot.chat("chat", MSG, tools=TOOLS, max_tokens=1)
    assert offered.usage.prompt_tokens > plain.usage.prompt_tokens + 40  # both tools' signatures are in it
    assert text_engine.tool_parser_name == "hermes"  # read from the template's <tool_call> syntax


async def test_a_schema_vllm_cannot_compile_is_bad_input_and_costs_nothing(text_engine):
    async with Shared(text_engine) as arbiter:
        bot = arbiter.app("a").agent("bot")
        bad = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "bogus"}}}
        with pytest.raises(fa.InvalidParameterError, match="vLLM rejected"):
            await bot.chat("chat", MSG, response_format=bad, max_tokens=8)
        assert arbiter.stats().apps == {} or arbiter.stats().apps["a"].failed == 0
        ok = await bot.chat("chat", MSG, max_tokens=4, ignore_eos=True)  # others unaffected
    assert ok.usage.completion_tokens == 4


async def test_another_apps_structured_request_is_served_while_the_largest_accepted_schema_compiles(text_engine):
    limit = fa.RequestLimits().max_enum_values
    fresh = [f"{uuid.uuid4().hex[:12]}" for _ in range(limit)]  # values no earlier compile has seen: no cache hit
    big = {"type": "object", "properties": {"v": {"enum": fresh}}, "required": ["v"], "additionalProperties": False}
    async with Shared(text_engine) as arbiter:
        heavy, quiet = arbiter.app("heavy").agent("bot"), arbiter.app("quiet").agent("bot")
        with pytest.raises(fa.InvalidParameterError, match="max_enum_values"):  # one past the limit costs nothing
            await heavy.chat("chat", MSG, max_tokens=8, response_format={
                "type": "json_schema", "json_schema": {"name": "big", "schema": {**big, "properties": {
                    "v": {"enum": [*fresh, "one-more"]}}}}})
        began = time.monotonic()
        at_limit = asyncio.create_task(heavy.chat("chat", MSG, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "big", "schema": big}}))
        await asyncio.sleep(0)
        reply = await quiet.chat("chat", MSG, max_tokens=64, seed=1, response_format={
            "type": "json_schema", "json_schema": {"name": "zone", "schema": ZONE}})
        waited = time.monotonic() - began
        await at_limit
    jsonschema.validate(reply.json(), ZONE)
    # a 100,000-value enum compiled for 32 s here before it was refused; at the limit, the
    # quiet app's request is not held for more than a few seconds even on a loaded machine
    assert waited < 5.0, waited
