"""The Python API guide, runnable end to end on the embedded tiny model."""

import asyncio
import contextlib

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine


async def main():
    arbiter = fa.Arbiter(policy="hmfs")
    arbiter.add_model("chat", VLLMEngine())  # the embedded model; or VLLMEngine("path/or/name")
    driving = arbiter.app("driving", weight=2.0)
    planner = driving.agent("planner", slo=fa.SLO(ttft=1.0))
    messages = [{"role": "user", "content": "Plan a route to the harbour."}]
    async with arbiter:
        reply = await planner.chat("chat", messages, max_tokens=32)
        print(reply.text, reply.usage.unified_tokens, reply.timing.ttft)
        print(arbiter.stats().apps["driving"])

        # --8<-- [start:stream]
        async with contextlib.aclosing(planner.stream_chat("chat", messages, max_tokens=32)) as stream:
            async for delta in stream:
                print(delta.text, end="", flush=True)
        # --8<-- [end:stream]

        # --8<-- [start:faults]
        try:
            await planner.chat("chat", messages, max_tokens=0)
        except ValueError as err:  # InvalidParameterError: nothing charged, nothing queued
            print(type(err).__name__, err)

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.05):  # aborted in the engine; charged for what it produced
                await planner.chat("chat", messages, max_tokens=500, ignore_eos=True)
        # --8<-- [end:faults]
    assert arbiter.stats().agents["driving/planner"].cancelled == 1


if __name__ == "__main__":
    asyncio.run(main())
