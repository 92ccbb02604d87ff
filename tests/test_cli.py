from fairagents.cli import main


def test_demo_says_it_is_simulated_and_compares_policies(capsys):
    assert main(["demo", "--policy", "fcfs", "--policy", "hmfs"]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED" in out
    assert "policy fcfs" in out and "policy hmfs" in out
    for app in ("driving", "studio", "flood"):
        assert app in out
