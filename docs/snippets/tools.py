"""The tools and structured output guide, runnable end to end on the embedded tiny model."""

import asyncio
import json

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine

# --8<-- [start:tools]
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Today's weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    },
}


def weather(city: str) -> str:
    return f"{city}: 14 °C, light rain"
# --8<-- [end:tools]


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", VLLMEngine())  # its chat template offers tools; vLLM's "hermes" parser reads calls
    concierge = arbiter.app("concierge").agent("planner")
    async with arbiter:
        # --8<-- [start:loop]
        messages = [{"role": "user", "content": "What is the weather in Bergen?"}]
        reply = await concierge.chat("chat", messages, tools=[WEATHER], tool_choice="required",
                                     parallel_tool_calls=False, max_tokens=300, seed=1)
        assert reply.finish_reason == "tool_calls"
        messages.append({"role": "assistant", "content": None,
                         "tool_calls": [call.as_openai() for call in reply.tool_calls]})
        for call in reply.tool_calls:  # run each call, and send its result back
            result = weather(**call.parsed_arguments())
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        final = await concierge.chat("chat", messages, tools=[WEATHER], max_tokens=32)  # "auto": it may answer
        print(final.text)
        # --8<-- [end:loop]

        # --8<-- [start:structured]
        schema = {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "rain": {"type": "boolean"}},
            "required": ["city", "rain"],
        }
        forecast = await concierge.chat(
            "chat", messages, max_tokens=300, seed=2,
            response_format={"type": "json_schema", "json_schema": {"name": "forecast", "schema": schema}},
        )
        print(forecast.json())  # valid against the schema: enforced while decoding
        # --8<-- [end:structured]

        # --8<-- [start:stream]
        async for delta in concierge.stream_chat("chat", messages, tools=[WEATHER], max_tokens=200,
                                                 tool_choice={"type": "function", "function": {"name": "weather"}}):
            for piece in delta.tool_calls:  # the first piece of a call has its id and name
                print(piece.index, piece.name or "", piece.arguments, end=" | ")
        # --8<-- [end:stream]
    assert isinstance(json.loads(json.dumps(forecast.json())), dict)


if __name__ == "__main__":
    asyncio.run(main())
