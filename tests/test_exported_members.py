import fairagents
import fairagents.engines
import fairagents.policies
import fairagents.shared


def test_all_is_sorted_and_exported():
    for module in (fairagents, fairagents.engines, fairagents.policies, fairagents.shared):
        assert module.__all__ == sorted(module.__all__), module.__name__
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_public_names_have_docstrings_with_examples():
    missing = []
    for module in (fairagents, fairagents.engines, fairagents.policies, fairagents.shared):
        for name in module.__all__:
            obj = getattr(module, name)
            if name.startswith("__") or isinstance(obj, str | dict):
                continue
            doc = getattr(obj, "__doc__", None) or ""
            if "Example" not in doc:
                missing.append(f"{module.__name__}.{name}")
    assert not missing
