"""The multi-modal guide: an app whose agents paint and critique, on the embedded vision and image models."""

import asyncio
import base64

import fairagents as fa
from fairagents.engines.diffusion import DiffusionEngine
from fairagents.engines.vision import VisionEngine
from fairagents.errors import InvalidImageError


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("vision", VisionEngine())  # the embedded tiny Idefics3 VLM
    arbiter.add_model("image", DiffusionEngine())  # the embedded tiny PixArt-α
    studio = arbiter.app("studio")
    painter, critic = studio.agent("painter"), studio.agent("critic")
    async with arbiter:
        # --8<-- [start:generate]
        art = await painter.generate_image("image", "a lighthouse at dusk", size=(64, 64), steps=4, n=1, seed=0)
        print(art.images[0].size, len(art.png[0]) > 0)  # (64, 64) True: PIL images and PNG bytes
        print(art.usage.completion_tokens)  # 1024: (64/2/2)² latent patches × 4 steps
        # --8<-- [end:generate]
        assert art.usage.completion_tokens == 1024
        # --8<-- [start:chat]
        url = "data:image/png;base64," + base64.b64encode(art.png[0]).decode()
        review = await critic.chat(
            "vision",
            [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},  # or {"type": "image", "image": path_or_pil}
                {"type": "text", "text": "Critique this painting."},
            ]}],
            max_tokens=16,
        )
        print(review.usage.prompt_tokens)  # the image's tokens included
        # --8<-- [end:chat]
        # --8<-- [start:errors]
        try:
            await critic.chat("vision", [{"role": "user", "content": [{"type": "image", "image": b"not a png"}]}])
        except InvalidImageError as err:  # also a ValueError; nothing was charged or queued
            print(err)
        # --8<-- [end:errors]
        assert review.usage.prompt_tokens > 40


if __name__ == "__main__":
    asyncio.run(main())
