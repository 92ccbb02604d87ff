"""Every code sample on the docs site and in the README runs, so the docs cannot rot.

Pages show their Python inline, each block a copy of a file in ``docs/snippets/`` (or of a
section of one) that its fence's title names; the copies are checked here, and each
snippet runs here and must print what it does. Snippets that serve the embedded model get
the session's engine instead of starting their own. ``python -m tests.docs.sync`` rewrites
the blocks after a snippet changes.
"""

import ast
import inspect
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from .._shared import SharedEngine
from .sync import RESYNC, blocks, pages, shown

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SNIPPETS = sorted((DOCS / "snippets").glob("*.py"))
README_FENCE = re.compile(r"```python\n(.*?)```", re.S)
# snippets that need what the docs tests do not start; each is run where it says
RUN_ELSEWHERE = {"vllm_client.py": "tests/engines/test_fair_scheduler_http.py runs it against a live `vllm serve`"}

SESSION_LOOP = pytest.mark.asyncio(loop_scope="session")  # the shared engine lives in the session's loop


def _uses_real_engine(path: Path) -> bool:
    return "VLLMEngine" in path.read_text() or _uses_multimodal_engines(path)


def _uses_multimodal_engines(path: Path) -> bool:
    text = path.read_text()
    return "VisionEngine" in text or "DiffusionEngine" in text


async def _run(path: Path, capsys) -> None:
    namespace = runpy.run_path(str(path), run_name="__snippet__")  # module-level code runs here
    main = namespace.get("main")
    if main is not None and inspect.iscoroutinefunction(main):
        await main()
    assert capsys.readouterr().out.strip(), f"{path.name} printed nothing: a snippet shows what it does when run"


@SESSION_LOOP
@pytest.mark.parametrize(
    "path", [p for p in SNIPPETS if not _uses_real_engine(p) and p.name not in RUN_ELSEWHERE], ids=lambda p: p.name
)
async def test_snippet_runs(path, capsys):
    await _run(path, capsys)


@pytest.mark.engine
@SESSION_LOOP
@pytest.mark.parametrize("path", [p for p in SNIPPETS if _uses_multimodal_engines(p)], ids=lambda p: p.name)
async def test_snippet_runs_on_the_multimodal_engines(path, vision_engine, image_engine, monkeypatch, capsys):
    import fairagents.engines.diffusion as diffusion_module
    import fairagents.engines.vision as vision_module

    monkeypatch.setattr(vision_module, "VisionEngine", lambda *a, **k: SharedEngine(vision_engine))
    monkeypatch.setattr(diffusion_module, "DiffusionEngine", lambda *a, **k: SharedEngine(image_engine))
    await _run(path, capsys)


@pytest.mark.engine
@SESSION_LOOP
@pytest.mark.parametrize(
    "path", [p for p in SNIPPETS if _uses_real_engine(p) and not _uses_multimodal_engines(p)], ids=lambda p: p.name
)
async def test_snippet_runs_on_the_real_engine(path, text_engine, monkeypatch, capsys):
    import fairagents.engines.vllm as vllm_module

    monkeypatch.setattr(vllm_module, "VLLMEngine", lambda *a, **k: SharedEngine(text_engine))
    await _run(path, capsys)


@pytest.mark.parametrize("path", SNIPPETS, ids=lambda p: p.name)
def test_a_snippet_with_a_main_runs_it_as_a_script(path):
    tree = ast.parse(path.read_text())
    main = next((node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                 and node.name == "main"), None)
    if main is None:
        return  # a script: its module-level code is what runs
    run = "asyncio.run(main())" if isinstance(main, ast.AsyncFunctionDef) else "main()"
    last = tree.body[-1]
    guarded = isinstance(last, ast.If) and ast.unparse(last.test) == "__name__ == '__main__'"
    assert guarded and run in ast.unparse(last), f'{path.name} must end with `if __name__ == "__main__": {run}`'


def test_every_python_block_on_the_site_is_a_snippet():
    untitled = [block.where for page in pages() for block in blocks(page) if block.path is None]
    untitled += [f"{page.relative_to(ROOT)}: {line.strip()} (indented, or not spelled ```python)"
                 for page in pages() for line in page.read_text().splitlines()
                 if re.match(r"\s*```\s*\{?\.?py(thon)?\b", line) and not line.startswith("```python")]
    assert not untitled, (
        "a Python block on the site is not run by the tests: put its code in docs/snippets/, give the block "
        f'title="docs/snippets/<file>.py" (or "docs/snippets/<file>.py · <section>"), then run `{RESYNC}`: {untitled}'
    )


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_python_block_shows_its_snippet_as_it_is(page):
    stale = [f"{block.where} ({block.source})" for block in blocks(page)
             if block.path is not None and block.body != shown(block.path, block.section)]
    assert not stale, f"blocks differ from the snippets they show; `{RESYNC}` (make docs-sync) rewrites them: {stale}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_a_page_leads_with_a_whole_snippet(page):
    first = next(iter(blocks(page)), None)
    assert first is None or first.section is None, (
        f"{first.where} shows a part of {first.path.name}: a page's first Python block is a whole file the reader "
        "can run; show the file whole first, and its parts after"
    )


def test_every_snippet_is_shown_by_a_page():
    shown_files = {block.path for page in pages() for block in blocks(page)}
    assert not [p.name for p in SNIPPETS if p not in shown_files]


@pytest.mark.engine  # the README's first sample serves the embedded model
def test_readme_python_samples_run():
    samples = README_FENCE.findall((ROOT / "README.md").read_text())
    assert samples
    for block in samples:
        done = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
