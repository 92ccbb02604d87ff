"""A model's tool parser in the server's configuration."""

import pytest

from fairagents.server.config import ModelConfig

pytest.importorskip("vllm")


def test_tool_parser_reaches_the_engine_and_an_unknown_one_is_refused_early():
    assert ModelConfig(tool_parser="llama3_json").build().tool_parser_name == "llama3_json"
    assert ModelConfig(engine="vision", tool_parser="hermes").build().tool_parser_name == "hermes"
    assert ModelConfig().build().tool_parser_name is None  # inferred from the template on start
    with pytest.raises(ValueError, match="unknown tool parser 'no-such'"):
        ModelConfig(tool_parser="no-such").build()


def test_an_image_model_takes_no_tool_parser():
    with pytest.raises(ValueError, match="calls no tools"):
        ModelConfig(engine="diffusion", tool_parser="hermes")
