"""Images in and out: reading the images callers send, and encoding the ones models make.

A chat message's content may be a list of OpenAI-style parts. An image part is

- ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` (OpenAI's
  shape; in process the URL may also be a local file path or a ``file://`` URL, read no
  further than the byte limit; fairagents never fetches from the network, and its
  server takes ``data:`` URLs only),
- ``{"type": "image", "image": source}`` where ``source`` is a ``PIL.Image.Image``,
  raw encoded bytes, or a file path,
- or a ``PIL.Image.Image`` placed in the list as is.

Reading an image checks it against :class:`ImageLimits` before decoding the pixels
(the header says how large it is), so a huge image costs nothing but its header.
Everything here is synchronous and CPU-bound: the arbiter runs it in its
preprocessing pool, off the event loop (see :mod:`fairagents.runtime.preprocessing`).

Examples:
    >>> import base64, io
    >>> from PIL import Image
    >>> from fairagents.images import has_images, load_image, to_png
    >>> png = to_png(Image.new("RGB", (32, 16), "red"))
    >>> url = "data:image/png;base64," + base64.b64encode(png).decode()
    >>> has_images([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
    True
    >>> load_image(url).size
    (32, 16)
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairagents.errors import InvalidImageError, InvalidParameterError

__all__ = [
    "SUPPORTED_FORMATS",
    "ImageLimits",
    "has_images",
    "is_image_part",
    "load_image",
    "parse_size",
    "split_parts",
    "to_png",
]

#: Encoded formats accepted as input (PIL's names).
SUPPORTED_FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP"})


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """What an input image may be; larger or other input is an :class:`~fairagents.errors.InvalidImageError`.

    Examples:
        >>> from fairagents.images import ImageLimits
        >>> ImageLimits(max_pixels=0)
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: max_pixels must be an integer > 0, got 0
    """

    max_pixels: int = 4096 * 4096
    """Most pixels (width × height) of one image."""
    max_bytes: int = 32 * 2**20
    """Most bytes of one encoded image."""
    formats: frozenset[str] = SUPPORTED_FORMATS
    """Encoded formats accepted (PIL's names, such as ``"PNG"``)."""

    def __post_init__(self) -> None:
        for what in ("max_pixels", "max_bytes"):
            value = getattr(self, what)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidParameterError(f"{what} must be an integer > 0, got {value!r}")
        object.__setattr__(self, "formats", frozenset(f.upper() for f in self.formats))


def is_image_part(part: Any) -> bool:
    """Whether a content part is an image (in any accepted shape)."""
    if isinstance(part, dict):
        return part.get("type") in ("image_url", "image")
    return _is_pil(part)


def has_images(messages: Sequence[Any]) -> bool:
    """Whether any message's content holds an image part (cheap: decodes nothing)."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list | tuple) and any(is_image_part(p) for p in content):
            return True
    return False


def split_parts(messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Messages with every image part replaced by ``{"type": "image"}``, and the images' sources in order.

    Text parts become ``{"type": "text", "text": ...}``; any other part is bad input.
    """
    out: list[dict[str, Any]] = []
    sources: list[Any] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, str) or (content is None and message.get("tool_calls")):  # an assistant's calls
            out.append(dict(message))
            continue
        if not isinstance(content, list | tuple):
            raise InvalidParameterError(f"messages[{i}].content must be text or a list of parts, got {content!r}")
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            if _is_pil(part):
                sources.append(part)
                parts.append({"type": "image"})
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif isinstance(part, dict) and part.get("type") == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str) or not url:
                    raise InvalidImageError(f"messages[{i}].content[{j}]: image_url needs a 'url', got {part!r}")
                sources.append(url)
                parts.append({"type": "image"})
            elif isinstance(part, dict) and part.get("type") == "image" and "image" in part:
                sources.append(part["image"])
                parts.append({"type": "image"})
            else:
                raise InvalidParameterError(f"messages[{i}].content[{j}] is not a text or image part: {part!r}")
        out.append({**message, "content": parts})
    return out, sources


def load_image(source: Any, limits: ImageLimits | None = None) -> Any:
    """Read one image source into an RGB ``PIL.Image.Image``, checking ``limits``.

    ``source`` is a ``data:`` URL, a file path (``str``, ``os.PathLike`` or a
    ``file://`` URL), encoded bytes, or a ``PIL.Image.Image``.

    Raises:
        InvalidImageError: not an image, corrupt, of a format not in ``limits.formats``,
            or larger than ``limits`` (bytes or pixels).
    """
    from PIL import Image, UnidentifiedImageError

    limits = limits or ImageLimits()
    if _is_pil(source):
        _check_pixels(source.size, limits)
        return source if source.mode == "RGB" else source.convert("RGB")
    data = _read(source, limits)
    try:
        with Image.open(io.BytesIO(data)) as image:  # reads the header only
            if image.format not in limits.formats:
                accepted = ", ".join(sorted(limits.formats))
                raise InvalidImageError(f"unsupported image format {image.format}; accepted: {accepted}")
            _check_pixels(image.size, limits)
            image.load()
            return image.convert("RGB")
    except UnidentifiedImageError:
        raise InvalidImageError(f"the image data is not a readable image ({len(data)} bytes)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):  # the warning, where warnings are errors
        raise InvalidImageError(f"the image is larger than {limits.max_pixels} pixels") from None
    except (OSError, SyntaxError, ValueError) as err:
        if isinstance(err, InvalidImageError):
            raise
        raise InvalidImageError(f"the image data is corrupt: {err}") from None


def parse_size(size: str) -> tuple[int, int]:
    """An OpenAI-style ``"WIDTHxHEIGHT"`` size as ``(width, height)``.

    Examples:
        >>> from fairagents.images import parse_size
        >>> parse_size("512x256")
        (512, 256)
        >>> parse_size("1_6x16")  # ASCII digits only: not Python's int() syntax
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: size must be 'WIDTHxHEIGHT', got '1_6x16'
    """
    match = _SIZE.fullmatch(size) if isinstance(size, str) else None
    if match is None:
        raise InvalidParameterError(f"size must be 'WIDTHxHEIGHT', got {size!r}", param="size")
    return int(match[1]), int(match[2])


_SIZE = re.compile(r"([0-9]{1,6})[xX]([0-9]{1,6})")


def to_png(image: Any) -> bytes:
    """Encode a ``PIL.Image.Image`` as PNG bytes."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _is_pil(obj: Any) -> bool:
    from PIL import Image

    return isinstance(obj, Image.Image)


def _read(source: Any, limits: ImageLimits) -> bytes:
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
    elif isinstance(source, str) and source.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidImageError("a data URL image must be base64: data:image/<format>;base64,<data>")
        if len(payload) * 3 // 4 > limits.max_bytes:
            raise InvalidImageError(f"the image is larger than {limits.max_bytes} bytes")
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidImageError("the data URL is not valid base64") from None
    elif isinstance(source, str | os.PathLike):
        text = os.fspath(source)
        if isinstance(text, str) and text.startswith(("http://", "https://")):
            raise InvalidImageError("image URLs are not fetched; send the image as a data URL, bytes or a file path")
        path = Path(text[len("file://") :] if isinstance(text, str) and text.startswith("file://") else text)
        try:
            with path.open("rb") as file:  # bounded: a device or a growing file is never read to its end
                data = file.read(limits.max_bytes + 1)
        except OSError as err:
            raise InvalidImageError(f"cannot read the image file {str(path)!r}: {err.strerror or err}") from None
    else:
        raise InvalidImageError(f"an image must be a data URL, bytes, a file path or a PIL image, got {type(source).__name__}")
    if len(data) > limits.max_bytes:
        raise InvalidImageError(f"the image is larger than {limits.max_bytes} bytes")
    return data


def _check_pixels(size: tuple[int, int], limits: ImageLimits) -> None:
    width, height = size
    if width * height > limits.max_pixels:
        raise InvalidImageError(f"the image is {width}×{height}, more than {limits.max_pixels} pixels")
    if width < 1 or height < 1:
        raise InvalidImageError(f"the image is empty ({width}×{height})")
