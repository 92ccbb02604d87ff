"""The embedded default models build on a fresh machine while the engines start together."""

import os
import re
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
        "tiny-llama-v3", "tiny-idefics3-v2", "tiny-pixart-v1"}


def test_check_model_source_names_the_path_or_name_and_why(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from fairagents.errors import EngineError, ModelLoadError
    from fairagents.models import check_model_source

    (tmp_path / "weights.bin").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    cases = {
        str(tmp_path / "missing"): "no folder",
        "./relative/missing": "no folder './relative/missing'",
        "a/b/c": "no folder 'a/b/c'",
        str(tmp_path / "weights.bin"): "is a file",
        str(tmp_path / "empty"): "has no config.json",
        "not a name!": "not a Hugging Face name",
    }
    for source, why in cases.items():
        with pytest.raises(ModelLoadError, match=re.escape(why)) as caught:
            check_model_source(source)
        assert "\n" not in str(caught.value) and isinstance(caught.value, EngineError)
    (tmp_path / "empty" / "config.json").write_text("{}")
    check_model_source(str(tmp_path / "empty"))  # a folder with a config is for the engine to judge
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache"):
        check_model_source("fairagents-tests/no-such-model")


def test_a_hub_name_that_cannot_be_fetched_fails_in_one_line():
    from fairagents.errors import ModelLoadError
    from fairagents.models import check_model_source

    with pytest.raises(ModelLoadError, match="fairagents-tests/no-such-model") as caught:
        check_model_source("fairagents-tests/no-such-model", timeout=2)  # unreachable here, or absent online
    assert "\n" not in str(caught.value)
