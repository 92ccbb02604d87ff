"""Loading images: what is read, and how much."""

import io
import os

import pytest

import fairagents as fa
from fairagents.images import ImageLimits, load_image


def png(size=(4, 4)):
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size).save(buffer, "PNG")
    return buffer.getvalue()


def test_a_file_is_read_no_further_than_the_byte_limit(tmp_path):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero here")
    with pytest.raises(fa.InvalidImageError, match="larger than 1000 bytes"):  # an endless file ends at the limit
        load_image("/dev/zero", ImageLimits(max_bytes=1000))
    path = tmp_path / "x.png"
    path.write_bytes(png())
    assert load_image(str(path)).size == (4, 4) and load_image(f"file://{path}").size == (4, 4)


def test_the_error_for_a_large_file_does_not_reveal_its_size(tmp_path):
    path = tmp_path / "big.png"
    path.write_bytes(b"\0" * 5000)
    with pytest.raises(fa.InvalidImageError) as err:
        load_image(str(path), ImageLimits(max_bytes=1000))
    assert "5000" not in str(err.value) and "5001" not in str(err.value)


def test_split_parts_keeps_an_assistants_calls_and_finds_images_in_tool_results():
    from fairagents.images import split_parts

    calls = [{"id": "c1", "type": "function", "function": {"name": "chart", "arguments": "{}"}}]
    messages = [
        {"role": "user", "content": "plot it"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]},
    ]
    parts, sources = split_parts(messages)
    assert parts[1] == messages[1] and parts[2]["content"] == [{"type": "image"}] and sources == ["data:x"]
    with pytest.raises(fa.InvalidParameterError, match="content must be text"):
        split_parts([{"role": "assistant", "content": None}])  # no calls: no content is bad input
