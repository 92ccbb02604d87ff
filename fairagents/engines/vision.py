"""A vision-language model served by vLLM in this process: chat with images.

:class:`VisionEngine` is a :class:`~fairagents.engines.vllm.VLLMEngine` (the same engine
thread, inbox and streaming) whose ``prepare_chat`` also takes image parts
(:mod:`fairagents.images` lists the shapes).

Preparing a request is the modality-aware preprocessing of DuetInfer: it decodes each
image, checks it against the engine's :class:`~fairagents.images.ImageLimits`, shrinks
it to the largest size the model's image processor keeps (so a 4000-pixel photo does not
travel further than this step), renders the chat template with one image placeholder per
image, and runs the model's own Hugging Face processor over text and images. The
arbiter calls it in its preprocessing pool, off the event loop.

Why count with the processor before dispatch. HMFS charges a request's prompt when it
is dispatched, and a prompt's image tokens are most of its cost; vLLM knows them only
once it has processed the request. The Hugging Face processor expands each placeholder
into the image's tokens exactly as vLLM does (vLLM runs that very processor), so its
``input_ids`` are the prompt vLLM will see: their length is charged, and
``RequestOutput.prompt_token_ids`` agrees (``tests/engines/test_vision.py`` checks
it). vLLM is then handed the rendered text and the shrunk images, and processes the
small images again — cheap, next to decoding the originals.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fairagents._logging import get_logger
from fairagents.engines.base import Prompt
from fairagents.engines.vllm import VLLMEngine
from fairagents.errors import EngineError, InvalidImageError, InvalidParameterError
from fairagents.identity import Modality
from fairagents.images import ImageLimits, load_image, split_parts
from fairagents.models import LOAD_LOCK
from fairagents.engines.prompts import template_messages

__all__ = ["VisionEngine"]

log = get_logger("fairagents.engines.vision")


@dataclass(frozen=True, slots=True)
class _VisionInput:
    text: str
    images: tuple[Any, ...]


class VisionEngine(VLLMEngine):
    """A vision-language model (image and text in, text out) served by vLLM in this process.

    Args:
        model: a Hugging Face VLM folder or name that vLLM serves; ``None`` builds and
            serves the embedded tiny Idefics3 (see :mod:`fairagents.models`).
        max_images: most images in one request.
        limits: what an input image may be (pixels, bytes, formats).
        **kwargs: as :class:`~fairagents.engines.vllm.VLLMEngine`.

    Examples:
        >>> from fairagents.engines.vision import VisionEngine
        >>> from fairagents.images import ImageLimits
        >>> engine = VisionEngine(max_images=2, limits=ImageLimits(max_pixels=1024 * 1024), kv_cache_bytes=64 * 2**20)
        >>> engine.engine_args(gpu=False)["limit_mm_per_prompt"]
        {'image': 2}
    """

    modality = Modality.VISION

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        max_images: int = 4,
        limits: ImageLimits | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(max_images, bool) or not isinstance(max_images, int) or max_images < 1:
            raise InvalidParameterError(f"max_images must be an integer ≥ 1, got {max_images!r}")
        engine_args = {"limit_mm_per_prompt": {"image": max_images}, **(kwargs.pop("engine_args", None) or {})}
        super().__init__(model, engine_args=engine_args, **kwargs)
        self.max_images = max_images
        self.limits = limits or ImageLimits()
        self._processor: Any = None
        self._longest_edge: int | None = None

    async def start(self) -> None:
        """Start vLLM on the model, then load its Hugging Face processor."""
        await super().start()
        if self._processor is None:
            self._processor = await asyncio.to_thread(_load_processor, self.model)
            size = getattr(self._processor.image_processor, "size", None) or {}
            edge = size.get("longest_edge") if isinstance(size, dict) else None
            self._longest_edge = int(edge) if edge else None

    async def stop(self) -> None:
        """Stop the engine and drop the processor."""
        await super().stop()
        self._processor = None

    def prepare_chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> Prompt:
        """Decode, check and shrink the images, render the template, and count tokens with the processor.

        ``tools`` are offered when the model's chat template renders them (the embedded
        model's does, in the Hermes syntax; a template that renders none refuses them, and
        a response format still applies).

        Raises:
            InvalidImageError: an image that is corrupt, of an unsupported format, or too large.
            InvalidParameterError: more than ``max_images`` images, or a part that is
                neither text nor image.
        """
        processor = self._processor
        if processor is None:
            raise EngineError("the engine is not started")
        parts, sources = split_parts(template_messages(messages))  # calls' arguments as the template writes them
        if len(sources) > self.max_images:
            raise InvalidParameterError(f"{len(sources)} images in one request; this model takes at most {self.max_images}")
        images = tuple(self._shrink(load_image(source, self.limits)) for source in sources)
        if tools and "tools" not in str(getattr(processor, "chat_template", None) or ""):
            raise InvalidParameterError("the model's chat template does not render tools; it cannot be offered any")
        try:
            text = processor.apply_chat_template(parts, add_generation_prompt=True, tokenize=False,
                                                 **({"tools": list(tools)} if tools else {}))
        except Exception as err:  # a template that rejects the conversation (roles, order)
            raise InvalidParameterError(f"the model's chat template rejected the messages: {err}") from err
        try:
            encoded = processor(text=text, images=[list(images)] if images else None)
        except Exception as err:  # the processor refused an image it could decode (odd shapes)
            raise InvalidImageError(f"the model's processor rejected the image: {err}") from err
        ids = encoded["input_ids"][0]
        if not len(ids):
            raise InvalidParameterError("the messages render to an empty prompt")
        return Prompt(token_ids=tuple(int(i) for i in ids), data=_VisionInput(text, images))

    def _shrink(self, image: Any) -> Any:
        edge = self._longest_edge
        if edge is None or max(image.size) <= edge:
            return image
        image = image.copy()
        image.thumbnail((edge, edge))
        return image

    def _engine_input(self, prompt: Prompt) -> dict[str, Any]:
        data = prompt.data
        if isinstance(data, _VisionInput) and data.images:
            return {"prompt": data.text, "multi_modal_data": {"image": list(data.images)}}
        return super()._engine_input(prompt)


def _load_processor(model: str | None) -> Any:
    from transformers import AutoProcessor

    try:
        with LOAD_LOCK:
            return AutoProcessor.from_pretrained(model)
    except Exception as err:
        raise EngineError(f"could not load the processor of {model!r}: {err}") from err
