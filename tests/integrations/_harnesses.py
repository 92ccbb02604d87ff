"""The coding-agent CLIs (Claude Code, Codex CLI, OpenCode), run as their users run them against a fairagents server.

``make test`` installs them with npm into ``.venv/harnesses`` (pinned versions); each runs
non-interactively in a home and work folder of its own, with the settings of the guide
(docs/guides/coding-agents.md): the server's URL and an app's key, the model ``chat``, and no
traffic to their vendors.
"""

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "harnesses" / "node_modules" / ".bin"
COMMANDS = {"claude": "claude", "codex": "codex", "opencode": "opencode"}


def installed(name):
    """Whether the harness's command is installed (by make test, where npm is present)."""
    return (BIN / COMMANDS[name]).exists()


@dataclass
class Turn:
    """What one run of a harness did: its exit code, output and time."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


def _env(home, **extra):
    return {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "TERM": "dumb", "HOME": str(home), **extra}


def claude(url, key, home, prompt="say hello", *, timeout=300, max_tokens=8000):
    """``claude -p`` against ``url`` (the server's root) with ``key`` as its Anthropic key."""
    env = _env(home, ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY=key, ANTHROPIC_MODEL="chat",
               ANTHROPIC_SMALL_FAST_MODEL="chat", ANTHROPIC_DEFAULT_HAIKU_MODEL="chat",
               ANTHROPIC_DEFAULT_SONNET_MODEL="chat", ANTHROPIC_DEFAULT_OPUS_MODEL="chat",
               CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(max_tokens), MAX_THINKING_TOKENS="0",
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
               DISABLE_ERROR_REPORTING="1", DISABLE_BUG_COMMAND="1")
    return _run([str(BIN / "claude"), "-p", prompt, "--model", "chat", "--output-format", "json", "--tools", "Read"],
                env, home, timeout)


def codex(url, key, home, prompt="say hello", *, timeout=300):
    """``codex exec`` against ``url`` (the server's ``/v1``) as a custom Responses provider, read-only."""
    config = home / ".codex"
    config.mkdir(parents=True, exist_ok=True)
    (config / "config.toml").write_text(f"""model = "chat"
model_provider = "fairagents"
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.fairagents]
name = "fairagents"
base_url = "{url}"
wire_api = "responses"
env_key = "FAIRAGENTS_API_KEY"

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false
""")
    env = _env(home, CODEX_HOME=str(config), FAIRAGENTS_API_KEY=key)
    return _run([str(BIN / "codex"), "exec", "--skip-git-repo-check", prompt], env, home, timeout)


def opencode(url, key, home, prompt="say hello", *, timeout=300, max_tokens=8000):
    """``opencode run`` against ``url`` (the server's ``/v1``) as an OpenAI-compatible provider."""
    config = home / ".config" / "opencode"
    config.mkdir(parents=True, exist_ok=True)
    (config / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"fairagents": {"npm": "@ai-sdk/openai-compatible", "name": "fairagents",
                                    "options": {"baseURL": url, "apiKey": "{env:FAIRAGENTS_API_KEY}"},
                                    "models": {"chat": {"name": "chat", "tool_call": True,
                                                        "limit": {"context": 65536, "output": max_tokens}}}}},
        "model": "fairagents/chat", "small_model": "fairagents/chat", "autoupdate": False, "share": "disabled",
    }))
    # OpenCode installs its plugin package from npm into its config folder unless a lock file says it is there.
    (config / "node_modules").mkdir(exist_ok=True)
    (config / "package-lock.json").write_text(json.dumps({"name": "opencode-config", "lockfileVersion": 3, "packages": {
        "": {"dependencies": {"@opencode-ai/plugin": "*"}}}}))
    env = _env(home, XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local" / "share"),
               XDG_CACHE_HOME=str(home / ".cache"), XDG_STATE_HOME=str(home / ".local" / "state"),
               FAIRAGENTS_API_KEY=key, OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_AUTOUPDATE="1",
               OPENCODE_DISABLE_DEFAULT_PLUGINS="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1")
    return _run([str(BIN / "opencode"), "run", "--title", "turn", prompt], env, home, timeout)


def _run(cmd, env, home, timeout):
    work = home / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)
    return Turn(done.returncode, done.stdout, done.stderr, time.monotonic() - start)

