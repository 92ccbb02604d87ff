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

How (:mod:`fairagents.engines.threaded`). One thread owns the pipeline (diffusers
pipelines are not safe to call from two threads) and runs one request at a time
(``max_num_seqs`` = 1, so the arbiter keeps the queue): the pipeline's step callback
posts each step to the event loop, and checks for an abort, which it honours by raising
out of the denoising loop. The images come in the last event, ``Delta.images``. Torch
runs on one thread here, as vLLM's engines do (``OMP_NUM_THREADS=1``, set on import
unless already set).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


os.environ.setdefault("OMP_NUM_THREADS", "1")

from fairagents._logging import get_logger  # noqa: E402
from fairagents.cost import ModelProfile  # noqa: E402
from fairagents.engines.base import Delta, GenerationParams, Prompt, _clip  # noqa: E402
from fairagents.engines.threaded import ThreadedEngine  # noqa: E402
from fairagents.errors import EngineError, InvalidParameterError, ModalityError  # noqa: E402
from fairagents.identity import Modality  # noqa: E402
from fairagents.models import LOAD_LOCK  # noqa: E402

__all__ = ["DiffusionEngine", "ImageSpec"]

log = get_logger("fairagents.engines.diffusion")


@dataclass(frozen=True, slots=True)
class ImageSpec:
    """What to make: the settings of one image-generation request (``Prompt.data``)."""

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


class DiffusionEngine(ThreadedEngine):
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
    kind = "diffusion"
    library = "diffusers"
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
        super().__init__(model)
        self.max_size, self.max_steps, self.max_images = max_size, max_steps, max_images
        self.default_steps = default_steps
        self.default_size = (0, 0)  # the model's own, on start()
        self.profile = ModelProfile(d_model=1, n_layers=1, modality=Modality.IMAGE)  # the denoiser's, on start()
        self.vae_scale = self.patch_size = 1
        self._max_text_tokens = 0
        self._aborted: set[str] = set()
        self._lock = threading.Lock()  # guards _aborted between the loop and the owner thread

    # -- lifecycle ---------------------------------------------------------------

    async def _ready(self, pipe: Any) -> None:
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
            raise InvalidParameterError(f"size must be (width, height) in pixels, got {size!r}", param="size")
        width, height = size
        step = self._step
        if not all(step <= v <= self.max_size and v % step == 0 for v in size):
            raise InvalidParameterError(
                f"this model makes images of {step} to {self.max_size} pixels a side in multiples of {step}, "
                f"not {_clip(width)}×{_clip(height)}", param="size"
            )
        for what, value, most in (("steps", steps, self.max_steps), ("n", n, self.max_images)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise InvalidParameterError(f"{what} must be an integer in [1, {most}], got {_clip(value)}",
                                            param=what)
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

    def _command(self, request_id: str, prompt: Prompt, params: GenerationParams) -> tuple[Any, ...]:
        spec = prompt.data
        if not isinstance(spec, ImageSpec):
            raise ModalityError("an image model runs prompts made by prepare_image")
        return "run", request_id, spec, params.seed, self.latent_tokens(spec.size, 1, spec.n)

    def _cancel(self, request_id: str, *, notify: bool) -> None:
        """Stop the request's denoising loop at its next step (its stream then ends with ``"abort"``)."""
        with self._lock:
            self._aborted.add(request_id)

    # -- the pipeline's thread -------------------------------------------------------

    def _load(self) -> Any:
        with LOAD_LOCK:
            from diffusers import DiffusionPipeline

            pipe = DiffusionPipeline.from_pretrained(self.model)
        pipe.set_progress_bar_config(disable=True)
        if getattr(getattr(pipe, "transformer", None), "config", None) is None or not hasattr(
            pipe.transformer.config, "patch_size"
        ):
            raise TypeError(f"{type(pipe).__name__} has no patched transformer denoiser (a DiT)")
        return pipe

    def _serve(self, pipe: Any, loop: asyncio.AbstractEventLoop) -> None:
        accepts = set(inspect.signature(pipe.__call__).parameters)
        while (command := self._inbox.get())[0] != "stop":
            _, rid, spec, seed, per_step = command
            self._run(pipe, accepts, rid, spec, seed, per_step, loop)

    def _run(self, pipe: Any, accepts: set[str], rid: str, spec: ImageSpec, seed: int | None, per_step: int,
             loop: asyncio.AbstractEventLoop) -> None:
        import torch

        reported = 0

        def on_step(*_: Any) -> Any:
            nonlocal reported
            with self._lock:
                if rid in self._aborted:
                    raise _Abort
            reported += 1
            self._post(loop, rid, Delta(per_step))
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
            self._post(loop, rid, Delta(0, "", "abort"))
            return
        with self._lock:
            self._aborted.discard(rid)
        # A multistep scheduler may skip the callback on warm-up steps: the last event carries the rest.
        self._post(loop, rid, Delta(per_step * max(spec.steps - reported, 0), "", "stop", tuple(images)))
