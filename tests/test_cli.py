import pytest

from fairagents.cli import main


def test_simulated_demo_says_so_and_compares_policies(capsys):
    assert main(["demo", "--simulated", "--policy", "fcfs", "--policy", "hmfs"]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out
    assert "policy fcfs" in out and "policy hmfs" in out
    for app in ("driving", "studio", "flood"):
        assert app in out


def test_real_demo_runs_end_to_end_and_writes_the_plot(tmp_path, capsys):
    pytest.importorskip("vllm")
    out = tmp_path / "demo.png"
    assert main(["demo", "--seconds", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "policy fcfs" in text and "policy hmfs" in text and "real in-process vLLM engine" in text
    assert out.stat().st_size > 10_000 and out.read_bytes()[:4] == b"\x89PNG"


def test_models_build_into_a_fresh_home(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.setenv("FAIRAGENTS_HOME", str(tmp_path))
    assert main(["models", "build"]) == 0
    path = tmp_path / "models" / "tiny-llama-v1"
    assert str(path) in capsys.readouterr().out
    import json

    config = json.loads((path / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (128, 2, 2)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True, return_dict=False)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert not any(p.name.startswith(".") and p.is_dir() for p in (tmp_path / "models").iterdir())  # no staging left
