"""The OpenAI client guide's tools, structured output, sync client and loops, runnable on the embedded tiny model."""

import asyncio
import json

from fairagents_openai import AsyncFairOpenAI, FairOpenAI
from pydantic import BaseModel, Field

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine
from fairagents.testing import FakeEngine

WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Today's weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}}}


class Forecast(BaseModel):
    city: str = Field(max_length=24)


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", VLLMEngine())  # the embedded tiny model
    planner = arbiter.app("travel").agent("planner")
    client = AsyncFairOpenAI(arbiter, agent=planner)
    async with arbiter:
        # --8<-- [start:tools]
        messages = [{"role": "user", "content": "What is the weather in Bergen?"}]
        completion = await client.chat.completions.create(
            model="chat", messages=messages, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
            max_tokens=300, seed=1,
        )
        message = completion.choices[0].message  # finish_reason "tool_calls"; content None
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            city = json.loads(call.function.arguments)["city"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{city}: 14 °C, light rain"})
        answer = await client.chat.completions.create(model="chat", messages=messages, tools=[WEATHER], max_tokens=32)
        # --8<-- [end:tools]

        # --8<-- [start:structured]
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}
        forecast = await client.chat.completions.create(
            model="chat", messages=messages, max_tokens=300, seed=2,
            response_format={"type": "json_schema", "json_schema": {"name": "forecast", "schema": schema}},
        )
        print(json.loads(forecast.choices[0].message.content))
        # --8<-- [end:structured]

        # --8<-- [start:parse]
        parsed = await client.chat.completions.parse(
            model="chat", messages=messages, response_format=Forecast, max_tokens=300, seed=3,
        )
        print(parsed.choices[0].message.parsed)  # a Forecast
        # --8<-- [end:parse]

        # --8<-- [start:stream]
        ask = [{"role": "user", "content": "What is the weather in Tromsø?"}]
        async with client.chat.completions.stream(
            model="chat", messages=ask, tools=[WEATHER], tool_choice="required", max_tokens=300, seed=4,
        ) as stream:
            async for event in stream:
                if event.type == "tool_calls.function.arguments.done":
                    print(event.name, event.arguments)
            final = await stream.get_final_completion()  # the calls create() would have returned
        # --8<-- [end:stream]

        # --8<-- [start:loops]
        def elsewhere():  # another thread, with an event loop of its own
            return asyncio.run(client.chat.completions.create(model="chat", messages=messages, max_tokens=8))

        await asyncio.to_thread(elsewhere)  # the call runs on the arbiter's loop; the answer comes back here
        # --8<-- [end:loops]
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert isinstance(parsed.choices[0].message.parsed, Forecast) and final.choices[0].message.tool_calls
    await asyncio.to_thread(sync_script)


def sync_script():
    # --8<-- [start:sync]
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", FakeEngine())  # a stand-in for the sketch; VLLMEngine() works the same
    with FairOpenAI(arbiter, agent=arbiter.app("travel").agent("planner")) as client:  # openai.OpenAI's drop-in
        completion = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi"}],
                                                    max_tokens=32)
        for chunk in client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "Hi"}],
                                                    max_tokens=32, stream=True):
            print(chunk.choices[0].delta.content or "", end="")
    # leaving `with` closed the arbiter the client had started on a thread of its own
    # --8<-- [end:sync]
    assert completion.choices[0].message.content


if __name__ == "__main__":
    asyncio.run(main())
