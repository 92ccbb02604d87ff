"""DiffusionEngine and generate_image, on a real diffusers pipeline (the embedded tiny PixArt-α)."""

import asyncio
import io

import pytest
from PIL import Image

import fairagents as fa
from fairagents.engines import GenerationParams, ImageEngine
from fairagents.errors import ModalityError

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]


class Pool:
    def __init__(self, **engines):
        self.arbiter = fa.Arbiter()
        for name, engine in engines.items():
            self.arbiter.add_model(name, engine)

    async def __aenter__(self):
        await self.arbiter.start()
        return self.arbiter

    async def __aexit__(self, *exc):
        await self.arbiter.close(stop_engines=False)


async def test_profile_is_the_denoiser(image_engine):
    assert isinstance(image_engine, ImageEngine)
    # 4 heads x 16 = width 64, 2 layers; VAE 2x, patches 2x2: a 64x64 image is 16 x 16 patches
    assert image_engine.profile == fa.ModelProfile(d_model=64, n_layers=2, modality=fa.Modality.IMAGE)
    assert (image_engine.vae_scale, image_engine.patch_size, image_engine.default_size) == (2, 2, (64, 64))
    assert image_engine.latent_tokens((64, 64), 4, 1) == 256 * 4
    assert image_engine.latent_tokens((128, 64), 3, 2) == 512 * 3 * 2


async def test_generate_reports_every_step_and_ends_with_the_images(image_engine):
    prompt = image_engine.prepare_image("a red square", size=(64, 32), steps=5, n=2)
    deltas = [d async for d in image_engine.generate("d1", prompt, GenerationParams(1, seed=3))]
    assert [d.new_tokens for d in deltas[:-1]] == [16 * 8 * 2] * 5
    last = deltas[-1]
    assert last.finish_reason == "stop" and last.new_tokens == 0
    assert [im.size for im in last.images] == [(64, 32)] * 2


async def test_generate_image_through_the_arbiter(image_engine):
    async with Pool(painter=image_engine) as arbiter:
        a = arbiter.app("studio").agent("painter")
        reply = await a.generate_image("painter", "a red square on blue", size=(64, 64), steps=4, n=2, seed=1)
        assert [im.size for im in reply.images] == [(64, 64)] * 2
        assert all(Image.open(io.BytesIO(png)).format == "PNG" for png in reply.png)
        assert reply.usage.completion_tokens == 256 * 4 * 2
        scale = 64 / 4096 * 2
        assert reply.usage.unified_tokens == pytest.approx(scale * (reply.usage.prompt_tokens + 2 * 2048))
        assert 0 <= reply.timing.queue_wait <= reply.timing.ttft <= reply.timing.e2e
        again = await a.generate_image("painter", "a red square on blue", size=(64, 64), steps=4, n=2, seed=1)
        assert again.png == reply.png  # same seed, same images
        default = await a.generate_image("painter", "x")
        assert default.images[0].size == image_engine.default_size
        assert default.usage.completion_tokens == 256 * image_engine.default_steps


async def test_output_is_charged_step_by_step(image_engine):
    async with Pool(painter=image_engine) as arbiter:
        a = arbiter.app("studio").agent("painter")
        await a.generate_image("painter", "steps", size=(64, 64), steps=6)
        charges = [c for c in arbiter.ledger.charges]
        scale = 64 / 4096 * 2
        output = [c.amount for c in charges[1:]]
        assert output == [pytest.approx(2 * 256 * scale)] * 6


async def test_cancel_stops_denoising_and_charges_only_steps_done(image_engine):
    async with Pool(painter=image_engine) as arbiter:
        a = arbiter.app("studio").agent("painter")
        task = asyncio.create_task(a.generate_image("painter", "long", size=(256, 256), steps=50))
        while not arbiter.ledger.charges or len(arbiter.ledger.charges) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        (record,) = arbiter.ledger.records
        assert record.outcome is fa.Outcome.CANCELLED
        assert 0 < record.output_tokens < 128 * 128 // 4 * 50
        assert record.output_tokens % (128 * 128 // 4) == 0
        # the engine is free again
        reply = await a.generate_image("painter", "after", size=(32, 32), steps=2)
        assert reply.finish_reason == "stop"


@pytest.mark.parametrize(
    "call",
    [
        dict(size=(60, 64)),  # not a multiple of 8
        dict(size=(1024, 64)),  # larger than max_size
        dict(size=(0, 64)),
        dict(size=64),
        dict(steps=0),
        dict(steps=-1),
        dict(steps=1000),
        dict(n=0),
        dict(n=-2),
        dict(n=99),
        dict(guidance=-1.0),
    ],
    ids=str,
)
async def test_bad_requests_are_typed_errors_and_cost_nothing(image_engine, call):
    async with Pool(painter=image_engine) as arbiter:
        a = arbiter.app("studio").agent("painter")
        with pytest.raises(fa.InvalidParameterError):
            await a.generate_image("painter", "a cat", **call)
        with pytest.raises(fa.InvalidParameterError):
            await a.generate_image("painter", "")
        assert not arbiter.ledger.charges and arbiter.policy.queued() == 0


async def test_chat_on_an_image_model_is_a_modality_error(image_engine):
    async with Pool(painter=image_engine) as arbiter:
        a = arbiter.app("studio").agent("painter")
        with pytest.raises(ModalityError):
            await a.chat("painter", [{"role": "user", "content": "hi"}])
        with pytest.raises(ModalityError):
            await a.complete("painter", "hi")
        assert not arbiter.ledger.charges
