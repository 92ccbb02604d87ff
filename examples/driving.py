"""Autonomous driving: perception, planner and reporter agents of one app, on the OpenAI drop-in client.

Three camera frames arrive at once. For each, perception describes the scene, the planner
plans the next manoeuvre from that description, and the reporter writes a line for the
fleet log. The agents share one drop-in OpenAI client; each call is charged to the agent
that ``@fa.agent`` binds around it. No agent passes its identity along.

Runs on the embedded tiny model (random weights: the text is gibberish, the serving real):

    python examples/driving.py
"""

from __future__ import annotations

import asyncio

from fairagents_openai import AsyncFairOpenAI

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine

APP = "driving"
FRAMES = [
    "a cyclist on the right, a parked van ahead, the light is red",
    "road works narrow the lane, a truck merges from the left",
    "clear road, a pedestrian waits at the crossing",
]


async def drive(arbiter: fa.Arbiter) -> list[str]:
    """Run the app on ``arbiter`` (a started arbiter with a model ``"chat"``); one log line per frame."""
    app = arbiter.app(APP, weight=2.0)
    app.agent("planner", weight=2.0)  # plans matter most inside this app
    app.agent("perception")
    app.agent("reporter")
    client = AsyncFairOpenAI(arbiter)

    async def ask(prompt: str, max_tokens: int) -> str:
        completion = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens
        )
        return completion.choices[0].message.content

    @fa.agent(app=APP, name="perception")
    async def perceive(frame: str) -> str:
        # A vision model would look at the camera image itself; until fairagents serves
        # one, perception is handed the scene in words.
        return await ask(f"List the obstacles in this scene: {frame}", max_tokens=24)

    @fa.agent(app=APP, name="planner")
    async def plan(scene: str) -> str:
        return await ask(f"Obstacles: {scene}\nPlan the next manoeuvre.", max_tokens=32)

    @fa.agent(app=APP, name="reporter")
    async def report(frame: str, manoeuvre: str) -> str:
        # The reporter is meant to draw a dashboard sketch with client.images.generate;
        # until the pool has an image model it writes the sketch's prompt instead.
        return await ask(f"Scene: {frame}\nPlan: {manoeuvre}\nWrite a log line and a sketch prompt.", max_tokens=24)

    async def one_frame(frame: str) -> str:
        return await report(frame, await plan(await perceive(frame)))

    return list(await asyncio.gather(*(one_frame(frame) for frame in FRAMES)))


async def main(arbiter: fa.Arbiter | None = None) -> list[str]:
    if arbiter is None:  # run alone: the embedded tiny model on an in-process vLLM engine
        arbiter = fa.Arbiter()
        arbiter.add_model("chat", VLLMEngine())
        async with arbiter:
            return await main(arbiter)
    log = await drive(arbiter)
    for frame, line in zip(FRAMES, log, strict=True):
        print(f"[{frame}]\n  -> {line!r}")
    return log


if __name__ == "__main__":
    asyncio.run(main())
