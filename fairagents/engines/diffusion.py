"""Image generation with a diffusers pipeline, in this process, reporting every denoising step.

What ``n`` is here (the raw tokens of unified tokens). The denoiser of a diffusion
transformer (DiT: PixArt, SD3, Flux, Sana) is a transformer whose tokens are latent
patches: the VAE shrinks a ``W × H`` image by ``vae_scale`` to a latent, which the
denoiser cuts into ``patch × patch`` patches, and every denoising step runs the whole
transformer over all of them. So one image of ``W × H`` in ``steps`` steps is

    n = (W / vae_scale / patch) · (H / vae_scale / patch) · steps

latent tokens (times ``n_images``), scaled into unified tokens by the denoiser's own
width and depth (``ModelProfile(d_model=heads × head_dim, n_layers=num_layers)`` read
from the transformer's config) like any model's tokens. They are output: each step's
patches are charged when the step completes, so a long generation counts against its
app while it runs. The caption's tokens are the prompt, charged at dispatch (the
denoiser cross-attends to them). A UNet denoiser has no patches; this engine serves
DiT pipelines, whose transformer config names ``patch_size``.

How. One thread owns the pipeline (diffusers pipelines are not safe to call from two
threads) and runs one request at a time (``max_num_seqs`` = 1, so the arbiter keeps the
queue): the pipeline's step callback posts each step to the event loop, and checks for
an abort, which it honours by raising out of the denoising loop. The images come in the
last event, ``Delta.images``. Torch runs on one thread here, as vLLM's engines do
(``OMP_NUM_THREADS=1``, set on import unless already set).

Examples:
    >>> from fairagents.engines.diffusion import DiffusionEngine
    >>> engine = DiffusionEngine()   # the embedded tiny PixArt, built on start()
    >>> engine.max_num_seqs, engine.modality.value
    (1, 'image')
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import math
import os
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any


os.environ.setdefault("OMP_NUM_THREADS", "1")

from fairagents._logging import get_logger  # noqa: E402
from fairagents.cost import ModelProfile  # noqa: E402
from fairagents.engines.base import LOAD_LOCK, Delta, GenerationParams, Prompt, one_line  # noqa: E402
from fairagents.errors import EngineError, InvalidParameterError, ModalityError, ModelLoadError, ProtocolError  # noqa: E402
from fairagents.identity import Modality  # noqa: E402

__all__ = ["DiffusionEngine", "ImageSpec"]

log = get_logger("fairagents.engines.diffusion")

_names = itertools.count(1)


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """What to make: the settings of one image-generation request (``Prompt.data``).

    Examples:
        >>> from fairagents.engines.diffusion import ImageSpec
        >>> ImageSpec("a red square", size=(64, 64), steps=4, n=2).n
        2
    """

    text: str
    """The caption."""
    size: tuple[int, int]
    """Width and height in pixels."""
    steps: int
    """Denoising steps."""
    n: int
    """Images to make from the caption."""
    guidance: float | None = None
    """Classifier-free guidance scale (``None``: the pipeline's default)."""


class _Abort(Exception):
    """Raised from the step callback to leave the denoising loop."""


class DiffusionEngine:
    """A diffusion-transformer pipeline (text in, images out) served in this process.

    Args:
        model: a diffusers pipeline folder or name whose denoiser is a transformer
            with a ``patch_size``; ``None`` builds and serves the embedded tiny
            PixArt-α (see :mod:`fairagents.models`).
        max_size: largest width or height in pixels a request may ask for.
        max_steps: most denoising steps a request may ask for.
        max_images: most images one request may ask for (``n``).
        default_steps: steps when a request does not say.

    Examples:
        >>> from fairagents.engines.diffusion import DiffusionEngine
        >>> DiffusionEngine(max_size=0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: max_size must be an integer > 0, got 0
    """

    modality = Modality.IMAGE
    max_num_seqs = 1

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        max_size: int = 512,
        max_steps: int = 100,
        max_images: int = 4,
        default_steps: int = 20,
    ) -> None:
        for what, value in (("max_size", max_size), ("max_steps", max_steps), ("max_images", max_images),
                            ("default_steps", default_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidParameterError(f"{what} must be an integer > 0, got {value!r}")
        self.model = None if model is None else str(model)
        self.max_size, self.max_steps, self.max_images = max_size, max_steps, max_images
        self.default_steps = default_steps
        self.default_size = (0, 0)  # the model's own, on start()
        self.healthy = True
        self.profile = ModelProfile(d_model=1, n_layers=1, modality=Modality.IMAGE)  # the denoiser's, on start()
        self.max_model_len = 0
        self.vae_scale = self.patch_size = 1
        self._tokenizer: Any = None
        self._max_text_tokens = 0
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._aborted: set[str] = set()
        self._running: set[str] = set()
        self._lock = threading.Lock()  # guards _aborted between the loop and the owner thread
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: EngineError | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Build the embedded model if needed, then load the pipeline on its own thread."""
        if self._thread is not None:
            if self._thread.is_alive() and self._failure is None:
                return
            await self.stop()  # a dead engine: reap its thread, then start anew (a restart)
        self._failure = None
        self.healthy = True
        self._inbox = queue.SimpleQueue()
        if self.model is None:
            from fairagents.models import ensure_default_models

            self.model = str((await asyncio.to_thread(ensure_default_models, ["image"]))["image"])
        else:
            from fairagents.models import check_model_source

            try:
                await asyncio.to_thread(check_model_source, self.model)
            except ModelLoadError:
                self.healthy = False
                raise
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[Any] = self._loop.create_future()
        self._thread = threading.Thread(target=self._own, args=(ready,), name=f"fairagents-diffusion-{next(_names)}", daemon=True)
        self._thread.start()
        pipe = await ready
        config = pipe.transformer.config
        width = getattr(config, "inner_dim", None) or config.num_attention_heads * config.attention_head_dim
        self.profile = ModelProfile(d_model=int(width), n_layers=int(config.num_layers), modality=Modality.IMAGE)
        self.patch_size = int(config.patch_size)
        self.vae_scale = int(pipe.vae_scale_factor)
        side = int(config.sample_size) * self.vae_scale
        self.default_size = (min(side, self.max_size), min(side, self.max_size))
        self._tokenizer = pipe.tokenizer
        self._max_text_tokens = int(min(pipe.tokenizer.model_max_length, 512))
        largest = self.max_size - self.max_size % self._step
        self.max_model_len = self._max_text_tokens + self.latent_tokens((largest, largest), self.max_steps, self.max_images)
        log.info("fairagents.diffusion.started", model=self.model, profile=str(self.profile), patch=self.patch_size,
                 vae_scale=self.vae_scale)

    async def stop(self) -> None:
        """Stop the pipeline's thread and release the model."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._inbox.put(("stop",))
        await asyncio.to_thread(thread.join)
        self._tokenizer = None

    # -- requests ------------------------------------------------------------------

    @property
    def _step(self) -> int:
        """Sizes must be multiples of this: whole patches of the latent, and diffusers' multiple of 8."""
        unit = self.vae_scale * self.patch_size
        return unit * 8 // math.gcd(unit, 8)

    def latent_tokens(self, size: tuple[int, int], steps: int, n: int) -> int:
        """``(W / vae_scale / patch) · (H / vae_scale / patch) · steps · n``, after checking what the model can make."""
        if self._tokenizer is None:
            raise EngineError("the engine is not started")
        if not (isinstance(size, Sequence) and len(size) == 2 and all(type(v) is int for v in size)):
            raise InvalidParameterError(f"size must be (width, height) in pixels, got {size!r}")
        width, height = size
        step = self._step
        if not all(step <= v <= self.max_size and v % step == 0 for v in size):
            raise InvalidParameterError(
                f"this model makes images of {step} to {self.max_size} pixels a side in multiples of {step}, "
                f"not {width}×{height}"
            )
        for what, value, most in (("steps", steps, self.max_steps), ("n", n, self.max_images)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise InvalidParameterError(f"{what} must be an integer in [1, {most}], got {value!r}")
        unit = self.vae_scale * self.patch_size
        return (width // unit) * (height // unit) * steps * n

    def prepare_image(
        self, prompt: str, *, size: tuple[int, int], steps: int, n: int, guidance: float | None = None
    ) -> Prompt:
        """Check the request and tokenize its caption as the text encoder reads it (truncated to its length)."""
        self.latent_tokens(size, steps, n)
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidParameterError(f"the image prompt must be a non-empty string, got {prompt!r}")
        if guidance is not None and (isinstance(guidance, bool) or not isinstance(guidance, int | float)
                                     or not math.isfinite(guidance) or guidance < 0):
            raise InvalidParameterError(f"guidance must be a finite number ≥ 0, got {guidance!r}")
        ids = self._tokenizer(prompt, truncation=True, max_length=self._max_text_tokens)["input_ids"]
        return Prompt(token_ids=tuple(ids), data=ImageSpec(prompt, tuple(size), steps, n, guidance))  # type: ignore[arg-type]

    def prepare_chat(self, messages: Sequence[dict[str, Any]]) -> Prompt:
        """An image model takes no chat: use ``generate_image``."""
        raise ModalityError("this model makes images; call generate_image, not chat")

    def prepare_text(self, text: str) -> Prompt:
        """An image model continues no text: use ``generate_image``."""
        raise ModalityError("this model makes images; call generate_image, not complete")

    async def generate(self, request_id: str, prompt: Prompt, params: GenerationParams) -> AsyncIterator[Delta]:
        """Make the images of ``prompt``: one event per denoising step, the images on the last."""
        if self._failure is not None:
            raise self._failure
        if self._thread is None or self._loop is None:
            raise EngineError("the engine is not started")
        spec = prompt.data
        if not isinstance(spec, ImageSpec):
            raise ModalityError("an image model runs prompts made by prepare_image")
        if request_id in self._running:
            raise ProtocolError(f"request id {request_id!r} is already running")
        per_step = self.latent_tokens(spec.size, 1, spec.n)
        sink: asyncio.Queue[Any] = asyncio.Queue()
        self._running.add(request_id)
        self._inbox.put(("run", request_id, spec, params.seed, per_step, sink))
        done = False
        try:
            while True:
                event = await sink.get()
                if isinstance(event, BaseException):
                    done = True
                    raise event
                done = event.finish_reason is not None
                yield event
                if done:
                    return
        finally:
            self._running.discard(request_id)
            if not done:  # the consumer left early: stop the denoising loop at its next step
                with self._lock:
                    self._aborted.add(request_id)

    async def abort(self, request_id: str) -> None:
        """End a running request at its next step; its stream ends with ``"abort"``."""
        if request_id in self._running:
            with self._lock:
                self._aborted.add(request_id)

    # -- the pipeline's thread -------------------------------------------------------

    def _own(self, ready: asyncio.Future[Any]) -> None:
        loop = self._loop
        assert loop is not None
        try:
            with LOAD_LOCK:
                from diffusers import DiffusionPipeline

                pipe = DiffusionPipeline.from_pretrained(self.model)
            pipe.set_progress_bar_config(disable=True)
            if getattr(getattr(pipe, "transformer", None), "config", None) is None or not hasattr(
                pipe.transformer.config, "patch_size"
            ):
                raise TypeError(f"{type(pipe).__name__} has no patched transformer denoiser (a DiT)")
        except BaseException as err:  # noqa: BLE001 - any failure to load is reported to start()
            failure = ModelLoadError(f"diffusers could not load {self.model!r}: {one_line(err)}")
            failure.__cause__ = err
            self.healthy = False
            self._failure = failure
            loop.call_soon_threadsafe(_settle, ready, None, failure)
            return
        loop.call_soon_threadsafe(_settle, ready, pipe, None)
        accepts = set(inspect.signature(pipe.__call__).parameters)
        while True:
            command = self._inbox.get()
            if command[0] == "stop":
                return
            _, rid, spec, seed, per_step, sink = command
            try:
                self._run(pipe, accepts, rid, spec, seed, per_step, sink, loop)
            except BaseException as err:  # noqa: BLE001 - a failure of the pipeline: fail the engine
                failure = EngineError(f"diffusers pipeline {self.model!r} failed: {err!r}")
                failure.__cause__ = err
                self._failure = failure
                self.healthy = False
                log.error("fairagents.diffusion.failed", model=self.model, error=repr(err))
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(sink.put_nowait, failure)
                self._drain(loop, failure)
                return

    def _run(self, pipe: Any, accepts: set[str], rid: str, spec: ImageSpec, seed: int | None, per_step: int,
             sink: asyncio.Queue[Any], loop: asyncio.AbstractEventLoop) -> None:
        import torch

        post = loop.call_soon_threadsafe
        reported = 0

        def on_step(*_: Any) -> Any:
            nonlocal reported
            with self._lock:
                if rid in self._aborted:
                    raise _Abort
            reported += 1
            post(sink.put_nowait, Delta(per_step))
            return _[-1] if _ and isinstance(_[-1], dict) else None  # callback_on_step_end returns its kwargs

        kwargs: dict[str, Any] = {
            "prompt": spec.text, "width": spec.size[0], "height": spec.size[1], "num_inference_steps": spec.steps,
            "num_images_per_prompt": spec.n, "output_type": "pil",
            "generator": torch.Generator().manual_seed(seed) if seed is not None else None,
        }
        if spec.guidance is not None:
            kwargs["guidance_scale"] = spec.guidance
        if "callback_on_step_end" in accepts:
            kwargs["callback_on_step_end"] = on_step
        else:  # PixArt-α: the older per-step callback
            kwargs.update(callback=on_step, callback_steps=1)
        for name, value in (("use_resolution_binning", False), ("clean_caption", False),
                            ("max_sequence_length", self._max_text_tokens)):
            if name in accepts:
                kwargs[name] = value
        try:
            images = pipe(**kwargs).images
        except _Abort:
            with self._lock:
                self._aborted.discard(rid)
            post(sink.put_nowait, Delta(0, "", "abort"))
            return
        with self._lock:
            self._aborted.discard(rid)
        # A multistep scheduler may skip the callback on warm-up steps: the last event carries the rest.
        post(sink.put_nowait, Delta(per_step * max(spec.steps - reported, 0), "", "stop", tuple(images)))

    def _drain(self, loop: asyncio.AbstractEventLoop, failure: EngineError) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                command = self._inbox.get_nowait()
                if command[0] == "run":
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(command[-1].put_nowait, failure)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
