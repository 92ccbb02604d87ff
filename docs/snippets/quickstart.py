import asyncio

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine


async def main():
    arbiter = fa.Arbiter(policy="hmfs", in_flight=4)
    arbiter.add_model("chat", VLLMEngine())  # the embedded tiny model
    flood, victim = arbiter.app("flood").agent("bot"), arbiter.app("victim").agent("bot")
    ask = [{"role": "user", "content": "Plan the next step."}]
    async with arbiter:
        calls = [flood.chat("chat", ask, max_tokens=16) for _ in range(40)]
        await asyncio.gather(*calls, *(victim.chat("chat", ask, max_tokens=16) for _ in range(4)))
    for app, s in arbiter.stats().apps.items():
        print(f"{app}: {s.done} done, median wait {s.wait_p50:.2f} s")


if __name__ == "__main__":
    asyncio.run(main())
