"""Anthropic's Messages and OpenAI's Responses on the embedded model, through their official clients, over HTTP.

Against the package's live ``fairagents serve``: the ``anthropic`` SDK (create, stream, a forced tool call, structured
output, token counting), openai's ``responses.create``/``stream``/``parse``, and the OpenAI Agents SDK on its default
model, the Responses one. As in test_frameworks.py, calls ask for at most 64 tokens and schemas are bounded, so that
the random-weight model completes a call or an answer within them; what decoding enforces (a forced call, a schema)
is what the tests check.
"""

import json

import anthropic
import openai
import pytest

from tests.integrations.conftest import FRAMEWORKS_KEY
from tests.integrations.test_frameworks import ASK, MAX_TOKENS, SEED, Forecast, run_forecaster

pytestmark = pytest.mark.engine

FORECAST_TOOL = {"name": "Forecast", "description": "The forecast", "input_schema": Forecast.model_json_schema()}


@pytest.fixture
async def claude(fairagents_server):
    async with anthropic.AsyncAnthropic(base_url=fairagents_server.removesuffix("/v1"), api_key=FRAMEWORKS_KEY,
                                        default_headers={"X-Fairagents-Agent": "claude"}, max_retries=0) as client:
        yield client


@pytest.fixture
async def gpt(fairagents_server):
    async with openai.AsyncOpenAI(base_url=fairagents_server, api_key=FRAMEWORKS_KEY, max_retries=0,
                                  default_headers={"X-Fairagents-Agent": "responses"}) as client:
        yield client


async def test_anthropic_create_stream_a_forced_tool_and_structured_output(claude):
    message = await claude.messages.create(model="chat", max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": ASK}],
                                           tools=[FORECAST_TOOL], tool_choice={"type": "tool", "name": "Forecast"})
    [call] = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and Forecast.model_validate(call.input)
    async with claude.messages.stream(model="chat", max_tokens=8, messages=[{"role": "user", "content": ASK}]) as stream:
        pieces = [text async for text in stream.text_stream]
        streamed = await stream.get_final_message()
    assert streamed.content[0].text == "".join(pieces) and streamed.usage.output_tokens == 8
    assert streamed.stop_reason == "max_tokens"
    parsed = await claude.messages.parse(model="chat", max_tokens=MAX_TOKENS, output_format=Forecast,
                                         messages=[{"role": "user", "content": ASK}])
    assert isinstance(parsed.parsed_output, Forecast)
    counted = await claude.messages.count_tokens(model="chat", messages=[{"role": "user", "content": ASK}])
    assert counted.input_tokens > 0


async def test_openai_responses_create_stream_and_parse(gpt):
    tool = {"type": "function", "name": "Forecast", "parameters": Forecast.model_json_schema(), "strict": False}
    called = await gpt.responses.create(model="chat", input=ASK, tools=[tool], max_output_tokens=MAX_TOKENS,
                                        tool_choice={"type": "function", "name": "Forecast"}, extra_body={"seed": SEED})
    [call] = [item for item in called.output if item.type == "function_call"]
    assert Forecast.model_validate(json.loads(call.arguments))
    async with gpt.responses.stream(model="chat", input=ASK, max_output_tokens=8) as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        done = await stream.get_final_response()
    assert done.output_text == "".join(deltas) and done.status == "incomplete" and done.usage.output_tokens == 8
    parsed = await gpt.responses.parse(model="chat", input=ASK, text_format=Forecast, max_output_tokens=MAX_TOKENS)
    assert isinstance(parsed.output_parsed, Forecast)


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_openai_agents_sdk_on_its_default_responses_model(gpt, streamed):
    agents = pytest.importorskip("agents")
    model = agents.OpenAIResponsesModel(model="chat", openai_client=gpt)
    result, calls = await run_forecaster(agents, model, streamed, extra_body={"seed": SEED})
    assert isinstance(result.final_output, Forecast)
    assert len(calls) == 1 and isinstance(calls[0], bool)
