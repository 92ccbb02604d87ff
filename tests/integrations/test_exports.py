"""The integrations' public surface: sorted ``__all__``, every name there, documented with an example."""

import fairagents_langgraph
import fairagents_openai
import pytest


@pytest.mark.parametrize("module", [fairagents_langgraph, fairagents_openai], ids=lambda m: m.__name__)
def test_all_is_sorted_exported_and_documented(module):
    assert module.__all__ == sorted(module.__all__)
    for name in module.__all__:
        obj = getattr(module, name)
        if not isinstance(obj, str):
            assert "Example" in (obj.__doc__ or ""), f"{module.__name__}.{name}"
