"""VisionEngine and image parts through the arbiter, on a real in-process vLLM (the embedded tiny Idefics3)."""

import asyncio
import base64
import io

import numpy as np
import pytest
from PIL import Image

import fairagents as fa
from fairagents.engines import GenerationParams
from fairagents.errors import InvalidImageError, ModalityError
from fairagents.images import ImageLimits, to_png

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]


def noise(width, height, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


def data_url(data: bytes, mime="image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def ask(*parts):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "describe the image"}]}]


def image_url(url):
    return {"type": "image_url", "image_url": {"url": url}}


class Pool:
    """An arbiter over the session's engines that leaves them running."""

    def __init__(self, **engines):
        self.arbiter = fa.Arbiter()
        for name, engine in engines.items():
            self.arbiter.add_model(name, engine)

    async def __aenter__(self):
        await self.arbiter.start()
        return self.arbiter

    async def __aexit__(self, *exc):
        await self.arbiter.close(stop_engines=False)


async def test_profile_is_the_language_model_and_modality_vision(vision_engine):
    assert vision_engine.profile == fa.ModelProfile(d_model=128, n_layers=2, modality=fa.Modality.VISION)
    block = vision_engine.kv_block_size  # as VLLMEngine measures it
    assert block > 1 and vision_engine.token_capacity > 0 and vision_engine.token_capacity % block == 0


async def test_image_tokens_counted_before_dispatch_match_vllm(vision_engine):
    """The processor's count (charged at dispatch) is the prompt vLLM runs, for images of several shapes."""
    text_only = vision_engine.prepare_chat([{"role": "user", "content": "describe the image"}]).n_tokens
    for i, (w, h) in enumerate([(64, 64), (200, 100), (30, 30), (900, 700)]):
        prompt = vision_engine.prepare_chat(ask({"type": "image", "image": noise(w, h, i)}))
        assert prompt.n_tokens > text_only + 8  # at least one tile of image tokens and its frame
        outputs = []

        def capture(events, _deliver=vision_engine._deliver):
            outputs.extend(e for _, e in events)
            _deliver(events)

        vision_engine._deliver = capture
        try:
            deltas = [d async for d in vision_engine.generate(f"v{i}", prompt, GenerationParams(3, ignore_eos=True))]
        finally:
            del vision_engine._deliver
        assert sum(d.new_tokens for d in deltas) == 3
        assert len(outputs[-1].prompt_token_ids) == prompt.n_tokens, (w, h)


async def test_chat_with_every_image_shape_charges_image_tokens(vision_engine, tmp_path):
    png = to_png(noise(64, 64))
    path = tmp_path / "photo.png"
    path.write_bytes(png)
    shapes = [
        image_url(data_url(png)),
        image_url(str(path)),
        image_url(f"file://{path}"),
        {"type": "image", "image": path},
        {"type": "image", "image": png},
        noise(64, 64),
    ]
    async with Pool(vlm=vision_engine) as arbiter:
        a = arbiter.app("a").agent("eye")
        replies = await asyncio.gather(*(a.chat("vlm", ask(shape), max_tokens=4, ignore_eos=True) for shape in shapes))
        expected = vision_engine.prepare_chat(ask(image_url(data_url(png)))).n_tokens
        assert [r.usage.prompt_tokens for r in replies] == [expected] * len(shapes)
        scale = 128 / 4096 * 2
        assert replies[0].usage.unified_tokens == pytest.approx(scale * (expected + 2 * 4))
        assert all(r.usage.completion_tokens == 4 for r in replies)
        two = await a.chat("vlm", ask(image_url(data_url(png)), noise(120, 60)), max_tokens=2)
        assert two.usage.prompt_tokens > expected
        text = await a.chat("vlm", [{"role": "user", "content": "no image"}], max_tokens=2, ignore_eos=True)
        assert text.usage.completion_tokens == 2 and text.usage.prompt_tokens < expected
        streamed = [d async for d in a.stream_chat("vlm", ask(noise(48, 48)), max_tokens=5, ignore_eos=True)]
        assert sum(d.new_tokens for d in streamed) == 5


def _bad_inputs(tmp_path):
    tiff = io.BytesIO()
    noise(16, 16).save(tiff, format="TIFF")
    corrupt = to_png(noise(64, 64))[:200]
    return [
        ("not an image", image_url(data_url(b"hello world, not a picture")), InvalidImageError),
        ("corrupt png", image_url(data_url(corrupt)), InvalidImageError),
        ("unsupported format", image_url(data_url(tiff.getvalue(), "image/tiff")), InvalidImageError),
        ("too many pixels", {"type": "image", "image": to_png(noise(300, 300))}, InvalidImageError),
        ("missing file", image_url(str(tmp_path / "nope.png")), InvalidImageError),
        ("network url", image_url("https://example.com/cat.png"), InvalidImageError),
        ("not base64", image_url("data:image/png;base64,@@@"), InvalidImageError),
        ("unknown part", {"type": "audio", "audio": b""}, fa.InvalidParameterError),
    ]


async def test_bad_images_are_typed_errors_and_cost_nothing(vision_engine, tmp_path):
    limits, vision_engine.limits = vision_engine.limits, ImageLimits(max_pixels=256 * 256)
    try:
        async with Pool(vlm=vision_engine) as arbiter:
            a = arbiter.app("a").agent("eye")
            for name, part, error in _bad_inputs(tmp_path):
                with pytest.raises(error) as caught:
                    await a.chat("vlm", ask(part), max_tokens=2)
                assert isinstance(caught.value, ValueError), name
            too_many = ask(*[noise(16, 16)] * (vision_engine.max_images + 1))
            with pytest.raises(fa.InvalidParameterError, match="at most"):
                await a.chat("vlm", too_many)
            assert not arbiter.ledger.charges and not arbiter.ledger.records and arbiter.policy.queued() == 0
            assert (await a.chat("vlm", ask(noise(64, 64)), max_tokens=2)).usage.completion_tokens == 2
    finally:
        vision_engine.limits = limits


async def test_an_image_for_a_text_model_is_a_modality_error(text_engine, vision_engine):
    async with Pool(chat=text_engine, vlm=vision_engine) as arbiter:
        a = arbiter.app("a").agent("eye")
        with pytest.raises(ModalityError):
            await a.chat("chat", ask(noise(32, 32)))
        with pytest.raises(ModalityError):
            await a.generate_image("vlm", "a cat")
        assert not arbiter.ledger.charges and arbiter.policy.queued() == 0
        assert arbiter.preprocessor.pending == 0


async def test_a_request_keeps_its_arrival_through_preprocessing(vision_engine):
    """Arrival is read when the call comes in: queue wait and TTFT include preprocessing."""
    clock_reads = []
    async with Pool(vlm=vision_engine) as arbiter:
        real = arbiter.clock

        def clock():
            clock_reads.append(real())
            return clock_reads[-1]

        arbiter.clock = clock
        a = arbiter.app("a").agent("eye")
        big = to_png(noise(1600, 1600))  # decoding and shrinking it takes tens of milliseconds
        reply = await a.chat("vlm", ask({"type": "image", "image": big}), max_tokens=2)
        (record,) = arbiter.ledger.records
        assert record.arrival == clock_reads[0]
        assert reply.timing.queue_wait >= 0.01  # the preprocessing time is inside it


WEATHER = {"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                                      "required": ["city"], "additionalProperties": False}}}


async def test_the_vision_model_calls_tools_and_reads_images_in_tool_results(vision_engine):
    """An agent that looks: the embedded VLM is offered tools, and a tool's result may be an image."""
    import jsonschema

    png = data_url(to_png(noise(80, 60)))
    history = [
        *ask(image_url(png)),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [image_url(png)]},  # a chart, say
    ]
    assert vision_engine.tool_parser_name == "hermes"  # read from its template, as for the text model
    async with Pool(vision=vision_engine) as arbiter:
        bot = arbiter.app("a").agent("eyes")
        reply = await bot.chat("vision", history, tools=[WEATHER], tool_choice="required",
                               parallel_tool_calls=False, max_tokens=400, seed=1)
        plain = await bot.chat("vision", history[:1], max_tokens=4)
    assert reply.finish_reason == "tool_calls", reply.text
    [call] = reply.tool_calls
    assert call.name == "weather"
    jsonschema.validate(call.parsed_arguments(), WEATHER["function"]["parameters"])
    with_tools = vision_engine.prepare_chat(history, tools=[WEATHER])
    assert '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>' in with_tools.data.text
    assert reply.usage.prompt_tokens == with_tools.n_tokens > plain.usage.prompt_tokens  # both images, the tools
