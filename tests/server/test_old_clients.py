"""Streamed tool calls read by the openai-python releases people still run: the project's floor, 3.3, and the newest.

A chunk carries one entry per call (OpenAI and vLLM never send two of one index): openai 3.3's stream helper kept
the first of two and then parsed the second's ``"`` as the arguments ("EOF while parsing a string"). Each release
runs in a process of its own (``make test`` installs the older ones into ``.venv/clients``) against a live server.
"""

import asyncio
import json
import sys
from pathlib import Path

import pytest

from fairagents.testing import FakeEngine

from ._support import KEYS, live, make_config
from .test_openai_surface import serve

CLIENTS = Path(__file__).resolve().parents[2] / ".venv" / "clients"
SCRIPT = """
import json, sys
import openai
from pydantic import BaseModel

class Forecast(BaseModel):
    sunny: bool
    unit: str

client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
chat = client.chat if hasattr(client.chat.completions, "stream") else client.beta.chat
with chat.completions.stream(model="chat", messages=[{"role": "user", "content": "weather?"}],
                             tools=[openai.pydantic_function_tool(Forecast)],
                             tool_choice={"type": "function", "function": {"name": "Forecast"}}) as stream:
    for _ in stream:
        pass
    done = stream.get_final_completion()
[call] = done.choices[0].message.tool_calls
print(json.dumps({"version": openai.__version__, "arguments": call.function.arguments,
                  "parsed": call.function.parsed_arguments.model_dump()}))
"""


@pytest.mark.parametrize("release", ["1.40.0", "3.3.0", "installed"])
async def test_a_strict_call_streams_whole_to_every_openai_release(release):
    path = CLIENTS / f"openai-{release}"
    if release != "installed" and not path.is_dir():
        pytest.skip(f"openai {release} is not installed (make test installs it into .venv/clients)")
    engine = FakeEngine(reply='{"sunny": true, "unit": "c"}', tokens_per_reply=4)
    async with live(serve(engine), make_config()) as (url, _):
        env = {"PYTHONPATH": str(path)} if release != "installed" else {}
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", SCRIPT, f"{url}/v1", KEYS["driving"],
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    env={"PATH": "/usr/bin:/bin", **env})
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out)
    assert release == "installed" or result["version"] == release
    assert json.loads(result["arguments"]) == result["parsed"] == {"sunny": True, "unit": "c"}
