"""The coding agents people run, unchanged, against ``fairagents serve`` of the embedded model, keys on.

Claude Code (``claude -p``, Anthropic's Messages API), Codex CLI (``codex exec``, a custom
Responses provider) and OpenCode (``opencode run``, chat completions), installed from npm by
``make test``, each complete a turn as their users run them (the settings of
docs/guides/coding-agents.md); the identity rules make each session a run of its app; two
harnesses under two keys are served side by side, each charged to its app, as its weight says.
The model has random weights: what they say is noise, and a turn's end is the model's end of
sequence.
"""

import concurrent.futures
import json

import httpx
import pytest

from ._harnesses import claude, codex, installed, opencode
from .conftest import HARNESS_APPS, OBSERVER_KEY

pytestmark = pytest.mark.engine


def _needs(name):
    if not installed(name):
        pytest.skip(f"{name} is not installed (make test installs the coding-agent CLIs with npm, where npm is present)")


def _fairness(url):
    return httpx.get(f"{url.removesuffix('/v1')}/v1/fairness", headers={"Authorization": f"Bearer {OBSERVER_KEY}"},
                     timeout=30).json()["apps"]


def _turn(name, url, home):
    app, key, _ = HARNESS_APPS[name]
    if name == "claude":
        return claude(url.removesuffix("/v1"), key, home)
    return (codex if name == "codex" else opencode)(url, key, home)


@pytest.mark.parametrize("name", ["claude", "codex", "opencode"])
def test_a_harness_completes_a_turn_as_a_run_of_its_app(fairagents_server, tmp_path, name):
    _needs(name)
    app = HARNESS_APPS[name][0]
    before = _fairness(fairagents_server)[app]
    turn = _turn(name, fairagents_server, tmp_path)
    assert turn.returncode == 0, (turn.stdout[-2000:], turn.stderr[-2000:])
    if name == "claude":
        result = json.loads(turn.stdout)
        assert result["type"] == "result" and result["subtype"] == "success" and not result["is_error"], result
        assert result["usage"]["output_tokens"] > 0
    else:
        assert turn.stdout.strip()  # the model's words, whatever they are
    after = _fairness(fairagents_server)[app]
    assert after["service"] > before["service"] and after["agents"]["default"]["service"] > 0
    assert after["runs"]["active"] + after["runs"]["completed"] > before["runs"]["active"] + before["runs"]["completed"]


def test_two_harnesses_under_two_keys_are_each_charged_to_their_app_by_weight(fairagents_server, tmp_path):
    _needs("claude")
    _needs("codex")
    before = _fairness(fairagents_server)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        turns = list(pool.map(lambda name: _turn(name, fairagents_server, tmp_path / name), ["claude", "codex"]))
    assert [t.returncode for t in turns] == [0, 0], [t.stderr[-1000:] for t in turns]
    after = _fairness(fairagents_server)
    coder, reviewer = after["coder"], after["reviewer"]
    assert coder["service"] > before["coder"]["service"] and reviewer["service"] > before["reviewer"]["service"]
    assert (coder["weight"], reviewer["weight"]) == (2.0, 1.0)
    assert coder["weight_share"] > reviewer["weight_share"]
