"""The coding agents people run, unchanged, against ``fairagents serve`` of the embedded model, keys on.

Claude Code (``claude -p``, Anthropic's Messages API), Codex CLI (``codex exec``, a custom
Responses provider) and OpenCode (``opencode run``, chat completions), installed from npm by
``make test``, each complete a turn as their users run them (the settings of
docs/guides/coding-agents.md); the identity rules make each session a run of its app; two
harnesses under their keys are served side by side, each charged to its own app.
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


def test_each_harness_completes_a_turn_as_a_run_of_its_app_side_by_side(fairagents_server, tmp_path):
    """The three at once, each under its app's key: each turn ends as its user would see it end, each is charged to
    its own app (weights 2, 1, 1), and each session is a run of that app."""
    names = [name for name in HARNESS_APPS if installed(name)]
    if not names:
        _needs("claude")
    before = _fairness(fairagents_server)
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        turns = dict(zip(names, pool.map(lambda name: _turn(name, fairagents_server, tmp_path / name), names)))
    after = _fairness(fairagents_server)
    for name, turn in turns.items():
        assert turn.returncode == 0, (name, turn.stdout[-2000:], turn.stderr[-2000:])
        if name == "claude":
            result = json.loads(turn.stdout)
            assert result["type"] == "result" and result["subtype"] == "success" and not result["is_error"], result
            assert result["usage"]["output_tokens"] > 0
        else:
            assert turn.stdout.strip()  # the model's words, whatever they are
        app = HARNESS_APPS[name][0]
        was, now = before[app], after[app]
        assert now["service"] > was["service"] and now["agents"]["default"]["service"] > 0, name
        assert now["runs"]["active"] + now["runs"]["completed"] > was["runs"]["active"] + was["runs"]["completed"], name
        assert now["weight"] == HARNESS_APPS[name][2]
    skipped = sorted(set(HARNESS_APPS) - set(names))
    if skipped:
        pytest.skip(f"not installed: {', '.join(skipped)} (make test installs the coding-agent CLIs with npm)")
