"""A model's tool parser and JSON whitespace rule in the server's configuration."""

import pytest
from pydantic import ValidationError

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


def test_json_is_compact_unless_a_model_asks_for_vllms_permissive_grammar():
    assert ModelConfig().build().engine_args(gpu=False)["structured_outputs_config"] == {
        "backend": "xgrammar", "disable_any_whitespace": True}
    assert ModelConfig(engine="vision").build().compact_json
    permissive = ModelConfig(compact_json=False).build()
    assert not permissive.compact_json and "structured_outputs_config" not in permissive.engine_args(gpu=False)
    remote = {"engine": "openai", "urls": ["http://127.0.0.1:1/v1"], "d_model": 64, "n_layers": 2}
    assert ModelConfig(**remote).build().compact_json  # what the replicas run, to check constraints as they do
    assert not ModelConfig(**remote, compact_json=False).build().compact_json
    with pytest.raises(ValidationError, match="compact_json"):
        ModelConfig(engine="diffusion", compact_json=True)
