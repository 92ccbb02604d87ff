import asyncio

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine


async def main():
    arbiter = fa.Arbiter(policy="hmfs", in_flight=4)
    arbiter.add_model("chat", VLLMEngine())  # the embedded tiny model
    flood = arbiter.app("flood").agent("bot")
    victim = arbiter.app("victim").agent("bot")
    ask = [{"role": "user", "content": "Plan the next step."}]
    async with arbiter:
        floods = [flood.chat("chat", ask, max_tokens=16) for _ in range(40)]
        victims = [victim.chat("chat", ask, max_tokens=16) for _ in range(4)]
        await asyncio.gather(*floods, *victims)
    for app, s in arbiter.stats().apps.items():
        print(f"{app}: {s.done} done, median wait {s.wait_p50:.2f} s")


if __name__ == "__main__":
    asyncio.run(main())
