import subprocess
import sys
from pathlib import Path

import pytest

import fairagents as fa
from fairagents.cli import main

from ._shared import SharedEngine


def test_simulated_demo_says_so_and_plays_the_demos_load(capsys, tmp_path):
    out = tmp_path / "sim.png"
    assert main(["demo", "--simulated", "--policy", "fcfs", "--policy", "hmfs", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "Nothing is served" in text and out.stat().st_size > 0
    assert "SIMULATED policy fcfs" in text and "SIMULATED policy hmfs" in text
    for agent, model in [("perception", "vision"), ("illustrator", "image"), ("planner", "chat"), ("chatty", "chat")]:
        assert f"{agent} ({model})" in text


@pytest.mark.parametrize("layout", ["one", "separate"])
def test_the_simulated_demo_holds_every_share_within_10_percent_of_its_entitlement_under_hmfs_only(layout):
    from fairagents import demo

    fair, fcfs = (demo.standings(demo.simulated(policy, 12.0, layout), 12.0) for policy in ("hmfs", "fcfs"))
    assert demo.worst_gap(fair) < 0.1 < 1.0 < demo.worst_gap(fcfs)
    studio = next(app for app in fair["local" if layout == "one" else "chat"] if app.name == "studio")
    assert next(agent for agent in studio.agents if agent.name == "writer").done > 30  # the writer is served


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="session")
async def test_real_demo_serves_all_three_modalities_and_writes_the_plot(tmp_path, text_engine, vision_engine,
                                                                          image_engine):
    from rich.console import Console

    from fairagents import demo

    out = tmp_path / "demo.png"
    console = Console(record=True, width=160)
    engines = {"chat": SharedEngine(text_engine), "vision": SharedEngine(vision_engine),
               "image": SharedEngine(image_engine)}
    results = await demo.run_async(console, seconds=3.0, out=out, engines=engines)
    text = console.export_text()
    assert "policy fcfs" in text and "policy hmfs" in text and "multi-modal pool" in text and "unified tokens in" in text
    for agent, model in [("perception", "vision"), ("illustrator", "image"), ("planner", "chat")]:
        assert f"{agent} ({model})" in text
    hmfs = results["hmfs"].stats  # under hmfs every app is served, whatever the flood does
    assert all(a.done > 0 for a in hmfs.apps.values()) and len(hmfs.agents) == len(demo.AGENTS)
    assert "device 'local' (chat, image, vision)" in text and "entitled" in text
    # the agent level on one device: studio's writer is served, and every app and agent is near its entitlement
    rows = demo.standings(results["hmfs"], 3.0)["local"]
    writer = next(agent for app in rows if app.name == "studio" for agent in app.agents if agent.name == "writer")
    assert writer.done > 0 and writer.served > 0
    assert demo.worst_gap({"local": rows}) < 0.3 < demo.worst_gap(demo.standings(results["fcfs"], 3.0))
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"


def test_the_demo_command_runs_the_real_demo_with_its_options(monkeypatch):
    from fairagents import demo

    seen = {}
    monkeypatch.setattr(demo, "main", lambda console, **kw: seen.update(kw))
    assert main(["demo", "--seconds", "2", "--out", "x.png", "--policy", "vtc"]) == 0
    assert seen == {"policies": ["vtc"], "seconds": 2.0, "out": "x.png", "model": None, "layout": "one"}
    assert main(["demo", "--devices", "separate"]) == 0 and seen["layout"] == "separate"


def test_models_build_into_a_fresh_home(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.setenv("FAIRAGENTS_HOME", str(tmp_path))
    assert main(["models", "build"]) == 0
    path = tmp_path / "models" / "tiny-llama-v3"
    assert str(path) in capsys.readouterr().out
    import json

    config = json.loads((path / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (128, 2, 2)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True, return_dict=False)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert not any(p.name.startswith(".") and p.is_dir() for p in (tmp_path / "models").iterdir())  # no staging left


def test_version_and_python_dash_m(capsys):
    import subprocess
    import sys

    import fairagents
    from fairagents.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"fairagents {fairagents.__version__}"
    run = subprocess.run([sys.executable, "-m", "fairagents", "serve", "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "OpenAI-compatible HTTP API" in run.stdout


def test_the_real_engines_import_from_fairagents_engines_on_use():
    import fairagents.engines as engines

    assert engines.OpenAIEngine.__module__ == "fairagents.engines.remote"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        engines.Nope  # noqa: B018


@pytest.mark.parametrize(("path", "why"), [
    ("/no/such/model", "no folder '/no/such/model'"),
    ("README.md", "'README.md' is a file"),
])
def test_a_model_that_cannot_load_is_one_line_and_exit_2(tmp_path, path, why):
    config = tmp_path / "pool.toml"
    config.write_text(f'[server]\nauth = false\n[models.chat]\npath = "{path}"\n')
    run = subprocess.run([sys.executable, "-m", "fairagents", "serve", "--config", str(config), "--port", "0"],
                         capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 2, run.stderr[-3000:]
    [line] = run.stderr.splitlines()
    assert line.startswith("fairagents serve: model 'chat': ") and why in line


@pytest.mark.parametrize(("options", "why"), [
    (["--policy", "no_such_module_here:Fair"], "--policy: policy 'no_such_module_here:Fair': no module named"),
    (["--policy", "lottery"], "--policy: unknown policy 'lottery'; choose from adaptive"),
])
def test_serve_with_a_policy_that_does_not_load_is_one_line_and_exit_2(capsys, options, why):
    assert main(["serve", *options]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"fairagents serve: {why}"), line


async def test_the_demo_refuses_an_unknown_layout_before_starting_anything():
    from fairagents import demo

    with pytest.raises(fa.InvalidParameterError, match="layout must be one of one, separate"):
        await demo.run({}, "hmfs", 1.0, layout="three")
