import json

import pytest

from fairagents.bench import BENCHMARKS, workflows
from fairagents.cli import main
from fairagents.errors import InvalidParameterError
from fairagents.policies import POLICIES
from fairagents.simulation import simulate_workflows
from fairagents.testing import FakeEngine


def test_registered_as_a_bench_command():
    assert BENCHMARKS["workflows"] is workflows


def test_every_scenario_scales_its_users():
    for name in workflows.SCENARIOS:
        full, half = workflows.scenario(name), workflows.scenario(name, users=0.5)
        assert [g.n for g in half.closed] == [max(1, round(g.n / 2)) for g in full.closed]
        apps = {g.mix[0][1].app.name for g in full.closed} | {mix[0][1].app.name for _, mix in full.open}
        assert len(apps) == (1 if name == "shared" else 2)  # two apps share the engine; "shared": one node of one app
        assert bool(full.open) == (name in workflows.OPEN_LOOP)
    weights = {g.name: g.mix[0][1].app.weight for g in workflows.scenario("weighted").closed}
    assert weights == {"gold": 2.0, "silver": 1.0}
    labels = {s.label for _, s in workflows.scenario("fanout").closed[0].mix}
    assert labels == {"single", "fanout16"}
    with pytest.raises(InvalidParameterError):
        workflows.scenario("nope")
    with pytest.raises(InvalidParameterError):
        workflows.scenario("chains", users=0)


def test_policies_default_to_the_baselines_and_those_named_for_runs():
    defaults = workflows.default_policies()
    assert defaults[:3] == ["fcfs", "hmfs", "hmfs_credit"]
    assert set(defaults[3:]) == {p for p in POLICIES if "run" in p} - {"fcfs", "hmfs"}
    assert workflows._policies(["vtc,sjf", "vtc"]) == ["fcfs", "hmfs", "hmfs_credit", "vtc", "sjf"]
    with pytest.raises(InvalidParameterError):
        workflows._policies(["nope"])


def test_summary_of_a_tiny_run():
    result = workflows.run(policies=["fcfs"], seconds=3, users=0.25)
    assert [c["name"] for c in result["scenarios"]] == list(workflows.SCENARIOS)
    assert result["policies"] == ["fcfs", "hmfs", "hmfs_credit"] and result["engine"] == "sim"
    for cell in result["scenarios"]:
        for policy, r in cell["results"].items():
            assert r["runs"] == sum(c["runs"] for c in r["classes"].values()) > 0
            assert all(c["mean"] <= c["p95"] * 1.5 for c in r["classes"].values())
            assert r["runs_per_s"]["total"] == pytest.approx(sum(v for k, v in r["runs_per_s"].items() if k != "total"))
            for key in ("share", "share_active"):
                shares = [a[key] for a in r["apps"].values() if a[key] is not None]
                assert not shares or sum(shares) == pytest.approx(1.0)
            assert 0 < r["jain"] <= 1
    assert [len(t.rows) for t in workflows.render(result)][-1] == 3 * len(workflows.SCENARIOS)


@pytest.mark.parametrize("policy", ["hmfs", "hmfs_credit"])
def test_weights_show_in_the_shares(policy):
    flows = workflows.scenario("weighted", 20.0, users=0.5)
    fair = workflows.summarize(simulate_workflows(flows, policy, workflows.engines()), 20.0)
    assert fair["apps"]["gold"]["weight"] == 2.0
    assert fair["apps"]["gold"]["share"] == pytest.approx(2 / 3, abs=0.07)


def test_cli_runs_a_tiny_configuration_and_writes_json(tmp_path, capsys):
    out = tmp_path / "workflows.json"
    assert main(["bench", "workflows", "--scenarios", "chains", "fanout", "--seconds", "2", "--users", "0.25",
                 "--policies", "vtc", "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["policies"] == ["fcfs", "hmfs", "hmfs_credit", "vtc"]
    assert [c["name"] for c in printed["scenarios"]] == ["chains", "fanout"]
    assert main(["bench", "workflows", "--scenarios", "flood", "--seconds", "1", "--users", "0.1"]) == 0
    assert "run completion time" in capsys.readouterr().out


def test_the_real_path_sends_every_call_with_its_run():
    flows = workflows.scenario("fanout", 0.4, users=0.2)
    results = workflows.run_real(flows, ["fcfs"], 0.4, FakeEngine(token_time=0.001))
    result = results["fcfs"]
    assert result.runs and {r.label for r in result.runs} <= {"single", "fanout16", "long"}
    assert len(result.records) == sum(r.calls for r in result.runs)
    assert all(r.service > 0 for r in result.runs)  # charged through the run id each call carried
    fan = [r for r in result.runs if r.label == "fanout16"]
    assert all(r.calls == 17 for r in fan)
    summary = workflows.run(scenarios=["chains"], policies=None, seconds=0.3, users=0.1, real=True,
                            engine=FakeEngine(token_time=0.001))
    assert summary["engine"] == "real" and summary["scenarios"][0]["results"]["fcfs"]["runs"] > 0


@pytest.mark.parametrize("name", workflows.OPEN_LOOP)
def test_open_loop_runs_arrive_at_a_rate_the_load_scales_whether_or_not_the_last_has_ended(name):
    full, half = (workflows.scenario(name, 60.0, users=users) for users in (1.0, 0.5))
    rate = len(full.open) / 60.0
    assert rate == pytest.approx(workflows.STREAM_RATE, rel=0.35) and len(half.open) < 0.7 * len(full.open)
    result = simulate_workflows(full, "hmfs", workflows.engines())
    research = sorted((r for r in result.runs if r.app == "research"), key=lambda r: r.start)
    assert {r.label for r in research} == {"k1", "k16"} and all(r.id.startswith("o") for r in research)
    assert len(research) == len(full.open)  # every run that arrived completed
    assert any(b.start < a.end for a, b in zip(research, research[1:], strict=False))  # none waits for the last
    assert {r.calls for r in research} == {2, 17}
    summary = workflows.summarize(result, 60.0)
    assert summary["by_app"]["research"]["runs"] == len(research)
    tables = workflows.render({"policies": ["hmfs"], "engine": "sim", "seconds": 60.0,
                               "scenarios": [{"name": name, "description": "", "results": {"hmfs": summary}}]})
    assert "research/*" in [str(c) for c in tables[0].columns[0]._cells]  # the app's runs, over its classes


def test_the_real_path_plays_open_loop_runs_as_they_arrive():
    flows = workflows.scenario("stream", 2.0, users=5.0)
    result = workflows.run_real(flows, ["fcfs"], 2.0, FakeEngine(token_time=0.001))["fcfs"]
    opened = [r for r in result.runs if r.app == "research"]
    assert len(opened) == len(flows.open) >= 2 and {r.calls for r in opened} <= {2, 17}
    assert all(r.user is None and r.id.startswith("o") for r in opened)
    assert min(r.start for r in opened) >= min(at for at, _ in flows.open) - 0.05  # each started at its arrival


@pytest.mark.parametrize("name", workflows.OPEN_LOOP)
def test_a_light_apps_runs_arriving_open_loop_are_faster_under_the_default_than_fcfs_and_hmfs(name):
    """Beside a backlogged app, each burst of the light app's runs goes ahead by its idle credit (the simulator)."""
    research = {p: workflows.run_scenario(name, p, seconds=30)["by_app"]["research"]
                for p in ("fcfs", "hmfs", "hmfs_credit")}
    assert research["hmfs_credit"]["mean"] < 0.9 * min(research["fcfs"]["mean"], research["hmfs"]["mean"])
    assert research["hmfs_credit"]["p95"] < min(research["fcfs"]["p95"], research["hmfs"]["p95"])
