"""``pip install fairagents`` is the library: the server, the benchmarks and the engines are extras.

Each check runs a fresh interpreter in which the extras' packages cannot be imported,
as if they were not installed.
"""

import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from fairagents.cli import EXTRAS

ROOT = Path(__file__).resolve().parents[1]

#: Every package of the server and bench extras (import names).
OPTIONAL = sorted({*EXTRAS["server"], *EXTRAS["bench"], "starlette"})


def _without(blocked, code):
    """Run ``code`` in a fresh interpreter where importing any of ``blocked`` fails as if it were not installed."""
    preamble = (
        "import importlib.abc, sys\n"
        f"BLOCKED = {sorted(blocked)!r}\n"
        "class NotInstalled(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] in BLOCKED:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NotInstalled())\n"
    )
    return subprocess.run([sys.executable, "-c", preamble + code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_library_imports_without_the_server_and_bench_extras():
    done = _without(OPTIONAL, (
        "import fairagents, fairagents.shared, fairagents.engines, fairagents.simulation, fairagents.metrics\n"
        "from fairagents import Arbiter\n"
        "from fairagents.engines import OpenAIEngine, SimEngine\n"
        "import fairagents.cli\n"
        "print(sorted(m for m in BLOCKED if m in sys.modules))\n"
    ))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_help_needs_no_extra():
    done = _without(OPTIONAL, "from fairagents.cli import main\nmain(['bench', 'scheduler', '--help'])\n")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "decisions per second" in done.stdout.lower()


@pytest.mark.parametrize(("argv", "blocked", "extra"), [
    (["serve"], ["fastapi"], "server"),
    (["serve", "--verbose"], ["uvicorn"], "server"),
    (["bench", "scheduler"], ["rich"], "bench"),
    (["demo", "--simulated"], ["matplotlib"], "bench"),
])
def test_a_command_without_its_extra_says_which_to_install(argv, blocked, extra):
    done = _without(blocked, f"import runpy\nsys.argv = ['fairagents', *{argv!r}]\n"
                             "runpy.run_module('fairagents', run_name='__main__')\n")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"fairagents {argv[0]}: needs the '{extra}' extra ({blocked[0]} is not installed)")
    assert line.endswith(f"pip install 'fairagents[{extra}]'")


def test_the_extras_named_by_the_command_line_are_those_of_the_package():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    providers = packages_distributions()
    for extra in ("server", "bench", "redis"):
        installed = {canonicalize_name(providers[module][0]) for module in EXTRAS[extra]}
        assert installed == {canonicalize_name(Requirement(r).name) for r in extras[extra]}, extra
    assert Requirement("fairagents[bench,redis,server]") in [Requirement(r) for r in extras["dev"]]
