"""Devices: one order over a device's engines, separate shares on separate devices (FakeEngine: a test double)."""

import asyncio

import fairagents as fa
from fairagents.testing import FakeEngine


async def b_share_of_chat(image_device):
    """App a keeps 'chat' and 'image' busy, app b only 'chat': b's part of the first 30 requests 'chat' runs."""
    arbiter = fa.Arbiter(in_flight=1)  # each model runs one request at a time
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=4, token_time=0.002), device="gpu0")
    arbiter.add_model("image", FakeEngine(tokens_per_reply=4, token_time=0.002), device=image_device)
    a, b = arbiter.app("a").agent("bot"), arbiter.app("b").agent("bot")
    messages = [{"role": "user", "content": "go"}]
    async with arbiter:
        await asyncio.gather(*[a.chat("chat", messages) for _ in range(30)],
                             *[a.chat("image", messages) for _ in range(30)],
                             *[b.chat("chat", messages) for _ in range(30)])
    chat = sorted((r for r in arbiter.ledger.records if r.model == "chat"), key=lambda r: r.dispatched)[:30]
    return arbiter.devices, sum(r.app == "b" for r in chat) / 30


async def main():
    devices, one = await b_share_of_chat("gpu0")  # one device: a's images count in its share
    print(devices, f"b ran {one:.0%} of the LLM's first 30 requests")
    devices, separate = await b_share_of_chat("gpu1")  # separate devices: a's images cost it nothing on the LLM
    print(devices, f"b ran {separate:.0%} of the LLM's first 30 requests")
    assert one >= 0.6 and 0.4 <= separate <= 0.6  # 2/3 and 1/2


if __name__ == "__main__":
    asyncio.run(main())
