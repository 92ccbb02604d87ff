"""The house's floors: no module imports from a floor above its own, and no imports go round in a loop.

Every import counts, those under ``TYPE_CHECKING`` and inside functions too: a loop of
type-only imports is still a loop to the reader.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "fairagents"

#: Lowest first; a module may import its own floor and those below.
FLOORS: list[list[str]] = [
    ["errors", "constants", "_logging", "_json"],
    ["identity", "limits", "labels", "images", "cost", "request", "reply", "tools", "records"],
    ["policies", "metrics", "runs", "stats"],
    ["dispatcher", "admission"],
    ["vllm", "models"],
    ["engines"],
    ["shared", "simulation"],
    ["runtime"],
    ["openai_request", "choices", "http_errors", "testing", "protocols"],
    ["server", "bench", "cli", "demo", "__main__", ""],
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(["fairagents", *parts])] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules ``name`` imports (the nearest module of each imported name)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" for alias in node.names] or [source]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def floor(name: str) -> int:
    """The floor of module ``name`` (by its first part under ``fairagents``)."""
    first = name.removeprefix("fairagents").lstrip(".").split(".")[0]
    for level, names in enumerate(FLOORS):
        if first in names:
            return level
    raise AssertionError(f"module {name} is on no floor: add it to FLOORS")


def test_every_module_is_on_a_floor():
    for name in MODULES:
        floor(name)


def test_no_module_imports_from_a_floor_above():
    upward = sorted(f"{name} -> {target}" for name, targets in GRAPH.items() for target in targets
                    if floor(target) > floor(name))
    assert not upward, "\n".join(upward)


def test_no_import_loops():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for name in GRAPH:
        if name not in index:
            visit(name)
    assert not loops, "\n".join(" <-> ".join(loop) for loop in loops)


@pytest.mark.parametrize("package", ["fairagents_openai", "fairagents_langgraph"])
def test_integrations_import_only_public_names(package):
    """An integration imports ``fairagents`` top-level names and public modules, never a private name."""
    import importlib

    root = Path(importlib.import_module(package).__file__).parent
    private = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fairagents."):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
                private += [f"{path.name}: {node.module}"] if any(p.startswith("_") for p in node.module.split(".")) else []
    assert private == []
