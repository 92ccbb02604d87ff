"""Two arbiters, one fair share: counters shared through a store (in memory here; Redis across processes)."""

import asyncio

import fairagents as fa
from fairagents.shared import MemoryStore, SharedCounters
from fairagents.testing import FakeEngine


async def main():
    replicas = FakeEngine(tokens_per_reply=8, token_time=0.002, max_num_seqs=4, shared_capacity=True)
    store = MemoryStore()  # across processes: counters="redis://10.0.0.7:6379/0" in each door
    # --8<-- [start:doors]
    doors = []
    for name in ("door-a", "door-b"):
        door = fa.Arbiter(counters=SharedCounters(store, door=name))  # or counters="redis://host:6379/0"
        door.add_model("chat", replicas)  # the same replicas behind every door (OpenAIEngine in production)
        door.app("heavy", weight=4.0)
        door.app("light", weight=1.0)
        doors.append(door)
    # --8<-- [end:doors]
    for door in doors:
        await door.start()
    heavy = doors[0].app("heavy", weight=4.0).agent("bot")  # heavy reaches the pool through door-a only
    light = doors[1].app("light", weight=1.0).agent("bot")  # light through door-b only
    replies = await asyncio.gather(*(who.chat("chat", [{"role": "user", "content": "hi"}], max_tokens=8)
                                     for who in (heavy, light) for _ in range(8)))
    print(len(replies), "replies; at most", replicas.max_running, "ran at once on the replicas' 4 slots")
    assert all(r.usage.completion_tokens == 8 for r in replies)
    assert replicas.max_running <= 4  # the doors together never hand the replicas more than their slots
    assert doors[0].counters.status()["doors"] == 2
    for door in doors:
        await door.close(stop_engines=False)


if __name__ == "__main__":
    asyncio.run(main())
