"""Every code sample on the docs site and in the README runs, so the docs cannot rot.

Pages include their Python from ``docs/snippets/`` (pymdownx.snippets); each snippet runs
here. Snippets that serve the embedded model get the session's engine instead of
starting their own.
"""

import inspect
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from .._shared import SharedEngine

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SNIPPETS = sorted((DOCS / "snippets").glob("*.py"))
FENCE = re.compile(r"```python\n(.*?)```", re.S)

SESSION_LOOP = pytest.mark.asyncio(loop_scope="session")  # the shared engine lives in the session's loop


def _uses_real_engine(path: Path) -> bool:
    return "VLLMEngine" in path.read_text() or _uses_multimodal_engines(path)


def _uses_multimodal_engines(path: Path) -> bool:
    text = path.read_text()
    return "VisionEngine" in text or "DiffusionEngine" in text


async def _run(path: Path) -> None:
    namespace = runpy.run_path(str(path), run_name="__snippet__")  # module-level code runs here
    main = namespace.get("main")
    if main is not None and inspect.iscoroutinefunction(main):
        await main()


@SESSION_LOOP
@pytest.mark.parametrize("path", [p for p in SNIPPETS if not _uses_real_engine(p)], ids=lambda p: p.name)
async def test_snippet_runs(path):
    await _run(path)


@pytest.mark.engine
@SESSION_LOOP
@pytest.mark.parametrize("path", [p for p in SNIPPETS if _uses_multimodal_engines(p)], ids=lambda p: p.name)
async def test_snippet_runs_on_the_multimodal_engines(path, vision_engine, image_engine, monkeypatch):
    import fairagents.engines.diffusion as diffusion_module
    import fairagents.engines.vision as vision_module

    monkeypatch.setattr(vision_module, "VisionEngine", lambda *a, **k: SharedEngine(vision_engine))
    monkeypatch.setattr(diffusion_module, "DiffusionEngine", lambda *a, **k: SharedEngine(image_engine))
    await _run(path)


@pytest.mark.engine
@SESSION_LOOP
@pytest.mark.parametrize(
    "path", [p for p in SNIPPETS if _uses_real_engine(p) and not _uses_multimodal_engines(p)], ids=lambda p: p.name
)
async def test_snippet_runs_on_the_real_engine(path, text_engine, monkeypatch):
    import fairagents.engines.vllm as vllm_module

    monkeypatch.setattr(vllm_module, "VLLMEngine", lambda *a, **k: SharedEngine(text_engine))
    await _run(path)


def test_every_python_sample_on_the_site_is_a_tested_snippet():
    untested = []
    for page in DOCS.rglob("*.md"):
        for block in FENCE.findall(page.read_text()):
            if not block.strip().startswith("--8<--"):
                untested.append(f"{page.relative_to(ROOT)}: {block.strip().splitlines()[0]}")
    assert not untested, "inline Python on the site is not run by the tests; move it to docs/snippets/"


def test_every_snippet_is_used_by_a_page():
    pages = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    unused = [p.name for p in SNIPPETS if f'"{p.name}' not in pages]
    assert not unused


@pytest.mark.engine  # the README's first sample serves the embedded model
def test_readme_python_samples_run():
    blocks = FENCE.findall((ROOT / "README.md").read_text())
    assert blocks
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
