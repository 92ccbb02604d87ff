"""The OpenAI client guide, runnable end to end on the embedded tiny model."""

import asyncio

from fairagents_openai import AsyncFairOpenAI

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", VLLMEngine())  # the embedded tiny model; or VLLMEngine("path/or/name")
    driving = arbiter.app("driving", weight=2.0)
    planner = driving.agent("planner")
    client = AsyncFairOpenAI(arbiter)  # where the code had openai.AsyncOpenAI()

    async with arbiter:
        with fa.acting_as(planner):  # who calls: taken from context at each call
            completion = await client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "Plan a route to the harbour."}], max_tokens=32
            )
        print(completion.choices[0].message.content, completion.usage)

        # --8<-- [start:stream]
        @fa.agent(app="driving", name="planner")  # or bind it around a whole function
        async def plan_aloud():
            stream = await client.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": "Think aloud about the route."}],
                max_tokens=32,
                stream=True,
                stream_options={"include_usage": True},
            )
            async with stream:  # leaving early ends the request, charged for what it produced
                async for chunk in stream:
                    if chunk.choices:
                        print(chunk.choices[0].delta.content or "", end="", flush=True)
                    else:
                        print("\n", chunk.usage)  # the last chunk: usage, unified tokens included

        await plan_aloud()
        # --8<-- [end:stream]

        # --8<-- [start:images]
        try:
            await client.images.generate(prompt="a dashboard sketch of the route")
        except ValueError as err:  # UnknownModelError: this pool has no image model
            print(type(err).__name__, err)
        # --8<-- [end:images]
    assert arbiter.stats().agents["driving/planner"].done == 2
    remote()  # built; no server is called here


def remote():
    # --8<-- [start:remote]
    client = AsyncFairOpenAI(base_url="http://localhost:8000/v1", api_key="sk-driving")  # the app's key
    with fa.acting_as(fa.Agent("planner", fa.App("driving"))):
        assert client.headers() == {"X-Fairagents-Agent": "planner"}  # sent with every call made here
    # --8<-- [end:remote]
    return client


if __name__ == "__main__":
    asyncio.run(main())
