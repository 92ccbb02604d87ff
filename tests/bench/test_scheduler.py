import json

from fairagents.bench import scheduler
from fairagents.cli import main


def test_run_returns_decisions_per_second_per_policy_and_size():
    result = scheduler.run(agents=(10, 100), decisions=500, repeats=2)
    assert set(result) == {"hmfs", "vtc"}
    assert all(set(row) == {"10", "100"} and all(v > 0 for v in row.values()) for row in result.values())


def test_cli_json(capsys):
    assert main(["bench", "scheduler", "--agents", "10", "--decisions", "300", "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"hmfs", "vtc"} and set(out["hmfs"]) == {"10"}


def test_cli_table(capsys):
    assert main(["bench", "scheduler", "--agents", "10", "--decisions", "300", "--repeats", "1"]) == 0
    assert "decisions per second" in capsys.readouterr().out
