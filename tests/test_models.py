"""The embedded default models build on a fresh machine while the engines start together."""

import os
import subprocess
import sys

import pytest

START_ALL_THREE = """
import asyncio
from fairagents.engines import embedded_pool

async def main():
    engines = list(embedded_pool().values())
    await asyncio.gather(*(e.start() for e in engines))  # each builds its model, in its own thread
    for e in engines:
        await e.stop()
    print("started", len(engines))

asyncio.run(main())
"""


@pytest.mark.engine
def test_engines_starting_at_once_build_their_models_in_a_fresh_home(tmp_path):
    # A fresh process and home: the builds (and transformers' lazy imports) race the engines' loads,
    # as on the first `make demo` of a new machine.
    env = {**os.environ, "FAIRAGENTS_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", START_ALL_THREE], env=env, capture_output=True, text=True,
                          timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "started 3" in done.stdout
    assert {p.name for p in (tmp_path / "models").iterdir() if not p.name.startswith(".")} >= {
        "tiny-llama-v2", "tiny-idefics3-v2", "tiny-pixart-v1"}
