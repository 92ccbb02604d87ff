import asyncio
import json
import math
import time

import pytest

from fairagents.bench import plots, spec, suite
from fairagents.cli import main
from fairagents.cost import ModelProfile
from fairagents.errors import EngineError, InvalidParameterError
from fairagents.identity import Modality
from fairagents.simulation import simulate
from fairagents.testing import FakeEngine

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = """
name: tiny
description: Two apps share one model; one floods it, the other is interactive and gives up after 2 s.
duration: 5
seed: 0
policies: [fcfs, hmfs]
models:
  chat: {max_running: 8, kv_capacity: 4096}
apps:
  flood:
    agents:
      bulk:
        model: chat
        arrival: {process: poisson, rate: 40}
        prompt: {dist: uniform, low: 50, high: 200}
        output: {dist: uniform, low: 20, high: 80}
        slo: {ttft: 5}
  interactive:
    weight: 2
    agents:
      bot:
        model: chat
        arrival: {process: poisson, rate: 3}
        prompt: 40
        output: 16
        slo: {ttft: 0.5, e2e: 3}
        timeout: 2
real:
  duration: 2
  rate_scale: 0.3
  max_prompt: 64
  max_output: 16
  models: {chat: text}
"""
METRIC_KEYS = {
    "requests", "finished", "cancelled", "throughput_tokens_per_s", "slo_attainment", "slo_violation_rate", "goodput",
    "ttft_p50", "ttft_p99", "tpot_p99", "e2e_mean", "jain", "jain_safi", "jain_exfairs", "max_gap", "gap_over_2u",
    "esg", "sim_seconds", "wall_seconds",
}
TIMELINE_KEYS = {"id", "app", "agent", "model", "arrival", "dispatched", "first_token", "finished", "prompt_tokens",
                 "output_tokens", "outcome", "slo", "slo_met"}


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def _stable(data):
    """A run's JSON less what depends on the machine and the moment."""
    data = json.loads(json.dumps(data))
    data.pop("machine", None)
    for metrics in data.get("policies", {}).values():
        metrics.pop("wall_seconds")
    if "metrics" in data:
        data["metrics"].pop("wall_seconds")
    return data


def test_a_run_writes_timelines_a_summary_and_plots(tiny, tmp_path):
    result = suite.run_scenario(tiny, ["fcfs", "vtc", "hmfs"], out=tmp_path / "out", progress=False)
    folder = tmp_path / "out" / "tiny"
    assert json.loads((folder / "summary.json").read_text()) == result
    workload = spec.build(spec.load_scenario(tiny)).workload
    for policy in ("fcfs", "vtc", "hmfs"):
        run = json.loads((folder / f"{policy}.json").read_text())
        assert (run["scenario"], run["policy"], run["engine"], run["seed"]) == ("tiny", policy, "sim", 0)
        assert run["metrics"] == result["policies"][policy]
        assert len(run["requests"]) == len(workload) == run["metrics"]["requests"]
        assert all(set(r) == TIMELINE_KEYS for r in run["requests"])
        assert sorted(r["arrival"] for r in run["requests"]) == sorted(q.at for q in workload.requests)
        assert {r["outcome"] for r in run["requests"]} <= {"finished", "cancelled"}
        cancelled = [r for r in run["requests"] if r["outcome"] == "cancelled"]
        assert len(cancelled) == run["metrics"]["cancelled"]
        assert all(r["app"] == "interactive" and not r["slo_met"] for r in cancelled)
    assert result["policies"]["fcfs"]["cancelled"] > result["policies"]["hmfs"]["cancelled"]  # behind the flood
    summary = (folder / "summary.md").read_text()
    assert summary.startswith("# Scenario `tiny`: simulator")
    assert all(f"| {policy} |" in summary for policy in ("fcfs", "vtc", "hmfs"))
    assert f"fairagents bench run {tiny} --policies fcfs,vtc,hmfs --engine sim --seed 0 --scale 1" in summary
    for name in ("service.png", "gap.png", "metrics.png"):
        data = (folder / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, name


def test_summary_keys_are_pinned_and_metrics_hang_together(tiny):
    result = suite.run_scenario(tiny, ["fcfs", "hmfs"], progress=False)
    assert set(result) == {"scenario", "engine", "seed", "scale", "machine", "policies"}
    assert set(result["machine"]) == {"platform", "cpu_count", "python", "fairagents"}
    assert (result["scenario"], result["engine"], result["seed"], result["scale"]) == ("tiny", "sim", 0, 1.0)
    assert list(result["policies"]) == ["fcfs", "hmfs"]
    for row in result["policies"].values():
        assert set(row) == METRIC_KEYS
        assert row["finished"] + row["cancelled"] == row["requests"] > 0
        assert row["slo_violation_rate"] == pytest.approx(1 - row["slo_attainment"])
        for key in ("slo_attainment", "goodput", "esg", "jain", "jain_safi", "jain_exfairs"):
            assert 0 <= row[key] <= 1, key
        assert row["ttft_p50"] <= row["ttft_p99"] and row["throughput_tokens_per_s"] > 0
    fcfs, hmfs = result["policies"]["fcfs"], result["policies"]["hmfs"]
    assert hmfs["gap_over_2u"] <= 1 < fcfs["gap_over_2u"]  # under fcfs the flood starves the other app
    assert fcfs["max_gap"] / fcfs["gap_over_2u"] == pytest.approx(hmfs["max_gap"] / hmfs["gap_over_2u"])  # one 2U


def test_the_scenario_s_own_policies_are_the_default(tiny):
    assert list(suite.run_scenario(tiny, progress=False)["policies"]) == ["fcfs", "hmfs"]


def test_a_seeded_run_is_reproducible_bit_for_bit_and_the_seed_matters(tiny, tmp_path):
    first = suite.run_scenario(tiny, ["vtc"], seed=7, out=tmp_path / "a", progress=False)
    second = suite.run_scenario(tiny, ["vtc"], seed=7, out=tmp_path / "b", progress=False)
    assert _stable(first) == _stable(second)
    for name in ("summary.json", "vtc.json"):
        a, b = (json.loads((tmp_path / d / "tiny" / name).read_text()) for d in ("a", "b"))
        assert _stable(a) == _stable(b)
    assert _stable(suite.run_scenario(tiny, ["vtc"], seed=8, progress=False)) != _stable(first)


def test_the_gap_over_time_climbs_to_the_largest_service_gap(tiny):
    built = spec.build(spec.load_scenario(tiny))
    result = simulate(built.workload, "fcfs", built.engines, apps=built.apps)
    steps = plots.service_gap_over_time(result.records, result.charges, result.app_weights())
    times, gaps = [t for t, _ in steps], [g for _, g in steps]
    assert times == sorted(times) and gaps == sorted(gaps) and len(set(times)) == len(times)
    assert gaps[-1] == pytest.approx(result.max_app_gap()) and gaps[-1] > 0


def test_compare_puts_summaries_and_runs_side_by_side(tiny, tmp_path):
    suite.run_scenario(tiny, ["fcfs", "hmfs"], out=tmp_path / "a", progress=False)
    suite.run_scenario(tiny, ["fcfs", "hmfs"], seed=1, out=tmp_path / "b", progress=False)
    a, b = tmp_path / "a" / "tiny" / "summary.json", tmp_path / "b" / "tiny" / "summary.json"
    result = suite.compare([a, b, tmp_path / "a" / "tiny" / "hmfs.json"])
    assert [(r["file"], r["seed"], r["policy"]) for r in result["rows"]] == [
        (str(a), 0, "fcfs"), (str(a), 0, "hmfs"), (str(b), 1, "fcfs"), (str(b), 1, "hmfs"),
        (str(tmp_path / "a" / "tiny" / "hmfs.json"), 0, "hmfs")]
    assert result["rows"][1]["metrics"] == result["rows"][4]["metrics"]  # the same run read from either file
    assert result["rows"][0]["metrics"] != result["rows"][2]["metrics"]
    assert set(result["metrics"]) == METRIC_KEYS
    markdown = suite.compare_markdown(result).splitlines()
    assert len(markdown) == 2 + 5 and markdown[3].startswith(f"| {a} | tiny | sim | hmfs |")
    assert suite.render_compare(result).row_count == 5
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(InvalidParameterError, match="neither a summary nor a run"):
        suite.compare([tmp_path / "other.json"])


def test_bad_input_is_refused_before_anything_runs(tiny):
    with pytest.raises(InvalidParameterError, match="unknown policy 'nope'"):
        suite.run_scenario(tiny, ["fcfs", "nope"], progress=False)
    with pytest.raises(spec.ScenarioError, match="unknown scenario 'no-such-scenario'"):
        suite.run_scenario("no-such-scenario", progress=False)
    with pytest.raises(InvalidParameterError, match="engine must be"):
        suite.run_scenario(tiny, engine="gpu", progress=False)
    with pytest.raises(InvalidParameterError, match="scale must be"):
        suite.run_scenario(tiny, scale=0.0, progress=False)


def test_cli_run_json_is_policy_to_metrics(tiny, tmp_path, capsys):
    assert main(["bench", "run", str(tiny), "--policies", "fcfs,vtc", "--seed", "2", "--out", str(tmp_path),
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed) == {"fcfs", "vtc"}
    assert all(set(row) == METRIC_KEYS for row in printed.values())
    summary = json.loads((tmp_path / "tiny" / "summary.json").read_text())
    assert _stable(summary)["policies"] == _stable({"policies": printed})["policies"]
    assert summary["seed"] == 2


def test_cli_run_table_and_compare(tiny, tmp_path, capsys):
    assert main(["bench", "run", str(tiny), "--policies", "hmfs", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny on the simulator" in out and "hmfs" in out
    assert main(["bench", "compare", str(tmp_path / "tiny" / "summary.json"), "--json"]) == 0
    assert [r["policy"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["hmfs"]
    assert main(["bench", "compare", str(tmp_path / "tiny" / "hmfs.json")]) == 0
    assert "hmfs" in capsys.readouterr().out


def test_tables_printed_to_a_pipe_keep_every_column_whole(tiny, tmp_path, capsys):
    deep = tmp_path / "a-folder-with-a-long-name" / "and-another-one-below-it"
    assert main(["bench", "run", str(tiny), "--policies", "fcfs,hmfs", "--out", str(deep)]) == 0
    assert main(["bench", "compare", str(deep / "tiny" / "summary.json"), str(deep / "tiny" / "hmfs.json")]) == 0
    out = capsys.readouterr().out  # captured: stdout is not a terminal
    assert "…" not in out
    header = next(line for line in out.splitlines() if "scenario" in line)
    for column in ("file", "scenario", "engine", "policy", "finished", "SLO met", "goodput", "TTFT p99 (s)",
                   "TPOT p99 (s)", "tok/s", "Jain (SAFI)", "gap / 2U", "ESG"):
        assert column in header, column  # every header on one line, none cut short
    assert sum(str(deep / "tiny" / "summary.json") in line for line in out.splitlines()) == 2
    assert main(["bench", "scenarios"]) == 0
    listed = capsys.readouterr().out
    assert all(description.splitlines()[0] in listed for description in spec.builtin_scenarios().values())


NO_SLOS = """
name: crowd
description: Twelve apps of one agent each, no SLOs, one overloaded model.
duration: 5
seed: 0
models:
  chat: {max_running: 4, kv_capacity: 4096}
apps:
  app:
    count: 12
    agents:
      bot:
        model: chat
        arrival: {process: poisson, rate: 6}
        prompt: {dist: uniform, low: 50, high: 200}
        output: {dist: uniform, low: 20, high: 80}
"""


def test_without_slos_the_slo_metrics_are_undefined_and_not_drawn(tmp_path, capsys):
    from matplotlib.figure import Figure
    from PIL import Image

    path = tmp_path / "crowd.yaml"
    path.write_text(NO_SLOS)
    result = suite.run_scenario(path, ["fcfs", "vtc"], out=tmp_path / "out", progress=False)
    for row in result["policies"].values():
        assert {k: row[k] for k in ("slo_attainment", "slo_violation_rate", "goodput", "esg")} == dict.fromkeys(
            ("slo_attainment", "slo_violation_rate", "goodput", "esg"))
        assert row["ttft_p99"] > 1 and row["finished"] == row["requests"]  # late, and nothing to measure it against
    folder = tmp_path / "out" / "crowd"
    timeline = json.loads((folder / "vtc.json").read_text())["requests"]
    assert all(r["slo"] is None and r["slo_met"] is None for r in timeline)
    fcfs = next(line for line in (folder / "summary.md").read_text().splitlines() if line.startswith("| fcfs |"))
    assert fcfs.split(" | ")[4:6] == ["—", "—"] and fcfs.endswith("| — |")  # SLO met, goodput; ESG
    # two panels (TTFT p99 and Jain's index) of 3.2 inches at 100 dpi; with SLOs all five
    with Image.open(folder / "metrics.png") as image:
        assert image.width == 2 * 320
    assert main(["bench", "run", str(path), "--policies", "fcfs"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "│ fcfs" in line)
    assert [cell.strip() for cell in row.split("│")[3:5]] == ["—", "—"]  # SLO met, goodput

    built = spec.build(spec.load_scenario(path))
    run = simulate(built.workload, "vtc", built.engines, apps=built.apps)
    fig = Figure()
    plots._plot_service(fig, result, {"vtc": run})
    legend = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert len(legend) == plots.SERVICE_LINES - 1 + 2 and legend[-2:] == [
        "5 other apps: least to most served", "5 other apps: mean"]  # seven apps drawn, five as a band


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "run", "TINY", "--policies", "fcfs,nope"], "unknown policy 'nope'"),
    (["bench", "run", "no-such-scenario"], "unknown scenario 'no-such-scenario'"),
    (["bench", "compare", "no-such-file.json"], "no such file"),
    (["bench", "run", "TINY", "--seed", "-1"], "seed must be an integer ≥ 0, got -1"),
])
def test_cli_bad_input_is_a_message_and_exit_code_2(argv, message, tiny, capsys):
    argv = [str(tiny) if a == "TINY" else a for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err and captured.out == ""


def test_cli_lists_the_built_in_scenarios_and_prints_the_schema(capsys):
    builtins = spec.builtin_scenarios()
    assert builtins
    assert main(["bench", "scenarios"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in builtins)
    assert main(["bench", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == spec.scenario_json_schema()


def test_the_existing_benchmarks_still_dispatch(capsys):
    assert main(["bench", "policies", "--policies", "fcfs", "--seconds", "2", "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"fcfs"}


def test_a_built_in_scenario_runs_from_its_loaded_object():
    scenario = spec.load_scenario("vtc-overload").model_copy(update={"duration": 30.0})
    result = suite.run_scenario(scenario, ["fcfs", "vtc"], progress=False)
    assert (result["scenario"], result["seed"]) == ("vtc-overload", scenario.seed)
    fcfs, vtc = result["policies"]["fcfs"], result["policies"]["vtc"]
    assert fcfs["requests"] == vtc["requests"] == len(spec.build(scenario).workload)
    assert vtc["max_gap"] < fcfs["max_gap"] / 3  # VTC's bound against the overloading client


def test_the_real_engine_path_plays_the_workload_open_loop_through_an_arbiter(tiny, tmp_path):
    # The serving path of --engine real, on a test double of an engine instead of vLLM: a request
    # takes 0.32 s, the interactive app gives up after 0.1 s, so each of its requests is cancelled.
    tiny.write_text(TINY.replace("timeout: 2", "timeout: 0.1"))
    engine = FakeEngine(tokens_per_reply=16, token_time=0.02, max_num_seqs=4)
    result = suite.run_scenario(tiny, ["fcfs", "hmfs"], engine="real", out=tmp_path, progress=True,
                                real_engines={"text": engine})
    built = spec.build(spec.load_scenario(tiny), engine="real")
    assert result["engine"] == "real" and list(result["policies"]) == ["fcfs", "hmfs"]
    interactive = sum(q.agent.app.name == "interactive" for q in built.workload.requests)
    for policy, row in result["policies"].items():
        assert set(row) == METRIC_KEYS
        assert row["requests"] == len(built.workload) and row["cancelled"] == interactive > 0
        assert row["finished"] == len(built.workload) - interactive and row["throughput_tokens_per_s"] > 0
        run = json.loads((tmp_path / "tiny" / f"{policy}.json").read_text())
        by_arrival = sorted(run["requests"], key=lambda r: r["arrival"])
        assert [r["arrival"] for r in by_arrival] == pytest.approx([q.at for q in built.workload.requests])
        assert [r["prompt_tokens"] for r in by_arrival] == [q.prompt_tokens for q in built.workload.requests]
        for r in by_arrival:
            assert r["outcome"] == ("cancelled" if r["app"] == "interactive" else "finished")
            if r["outcome"] == "finished":
                assert r["output_tokens"] == 16 and r["dispatched"] >= r["arrival"] - 1e-6
    sent = list(engine.prompts.values())  # every policy's requests that reached the engine
    assert 2 * (len(built.workload) - interactive) <= len(sent) <= 2 * len(built.workload)
    assert len({p.token_ids for p in sent}) == len(sent)  # no prompt repeats: no prefix-cache hits across runs
    assert (tmp_path / "tiny" / "gap.png").read_bytes().startswith(PNG_MAGIC)


MIXED = """
name: mixed
description: One vision model; one agent sends text only, the other two images a request.
duration: 5
models:
  vlm: {modality: vision}
apps:
  text:
    agents:
      chat: {model: vlm, images: 0, arrival: {process: poisson, rate: 4}, prompt: 20, output: 4}
  multimodal:
    agents:
      caption: {model: vlm, images: 2, arrival: {process: poisson, rate: 4}, prompt: 40, output: 4}
real:
  duration: 1
  models: {vlm: vision}
"""


class SeeingEngine(FakeEngine):
    """A vision model's test double that keeps the messages of every chat it prepares."""

    def __init__(self, **kwargs):
        super().__init__(profile=ModelProfile(4096, 1, Modality.VISION), **kwargs)
        self.messages = []

    def prepare_chat(self, messages):
        self.messages.append(messages)
        return super().prepare_chat(messages)


def test_on_a_vision_model_each_request_carries_the_images_its_agent_sends(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    engine = SeeingEngine(tokens_per_reply=4)
    result = suite.run_scenario(path, ["fcfs"], engine="real", progress=False, real_engines={"vision": engine})
    built = spec.build(spec.load_scenario(path), engine="real")
    assert built.images == {("text", "chat"): 0, ("multimodal", "caption"): 2}
    assert result["policies"]["fcfs"]["finished"] == len(built.workload)
    sent = {}  # words of a request's text (its agent's prompt: chat 20, caption 40) → images of each request
    for (message,) in engine.messages:
        *images, text = message["content"]
        assert all(part["type"] == "image" for part in images) and text["type"] == "text"
        sent.setdefault(len(text["text"].split()), []).append(len(images))
    count = {name: sum(q.agent.name == name for q in built.workload.requests) for name in ("chat", "caption")}
    assert sent == {20: [0] * count["chat"], 40: [2] * count["caption"]} and min(count.values()) > 0


@pytest.mark.engine
def test_a_small_run_on_the_real_engine_has_the_simulator_s_shape(tiny, tmp_path):
    result = suite.run_scenario(tiny, ["fcfs", "hmfs"], engine="real", out=tmp_path, progress=False)
    built = spec.build(spec.load_scenario(tiny), engine="real")
    assert result["engine"] == "real" and list(result["policies"]) == ["fcfs", "hmfs"]
    for policy, row in result["policies"].items():
        assert set(row) == METRIC_KEYS
        assert row["requests"] == len(built.workload) > 0
        assert row["finished"] > 0 and row["throughput_tokens_per_s"] > 0
        run = json.loads((tmp_path / "tiny" / f"{policy}.json").read_text())
        assert {r["outcome"] for r in run["requests"]} <= {"finished", "cancelled"}
        assert all(r["output_tokens"] <= 16 and not math.isnan(r["arrival"]) for r in run["requests"])
    assert (tmp_path / "tiny" / "gap.png").read_bytes().startswith(PNG_MAGIC)


class FlakyEngine(SeeingEngine):
    """A vision model whose preprocessing fails for every third request, before the request is queued."""

    def prepare_chat(self, messages):
        if len(self.messages) % 3 == 2:
            self.messages.append(messages)
            raise EngineError("the image processor crashed")
        return super().prepare_chat(messages)


class SlowImagesEngine(SeeingEngine):
    """A vision model whose image preparation takes longer than its callers wait."""

    def prepare_chat(self, messages):
        time.sleep(0.05)
        return super().prepare_chat(messages)


def test_requests_never_queued_are_recorded_so_every_request_is_counted(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    engine = FlakyEngine(tokens_per_reply=4)
    result = suite.run_scenario(path, ["fcfs"], engine="real", out=tmp_path, progress=False,
                                real_engines={"vision": engine})
    built = spec.build(spec.load_scenario(path), engine="real")
    row = result["policies"]["fcfs"]
    failed = len(engine.messages) // 3
    assert row["requests"] == len(built.workload) and failed > 0
    assert row["finished"] == len(built.workload) - failed and row["cancelled"] == 0
    outcomes = [r["outcome"] for r in json.loads((tmp_path / "mixed" / "fcfs.json").read_text())["requests"]]
    assert outcomes.count("failed") == failed and len(outcomes) == len(built.workload)


def test_a_request_given_up_while_its_images_are_prepared_is_recorded_as_cancelled(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED.replace("images: 2,", "images: 2, timeout: 0.02,"))
    engine = SlowImagesEngine(tokens_per_reply=4)
    result = suite.run_scenario(path, ["fcfs"], engine="real", progress=False, real_engines={"vision": engine})
    built = spec.build(spec.load_scenario(path), engine="real")
    row = result["policies"]["fcfs"]
    captions = sum(q.agent.name == "caption" for q in built.workload.requests)
    assert row["requests"] == len(built.workload) and row["cancelled"] == captions > 0


class BuggyImagesEngine(SeeingEngine):
    """A vision model whose preprocessing has a bug (not an engine error): the run must stop, all of it."""

    def prepare_chat(self, messages):
        if self.messages:
            raise RuntimeError("a bug in the image processor")
        return super().prepare_chat(messages)

    async def stop(self):
        self.sending_when_stopped = [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "_send"]
        await super().stop()


def test_an_unexpected_error_cancels_every_other_send_before_the_engines_stop(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    engine = BuggyImagesEngine(tokens_per_reply=4)
    with pytest.raises(RuntimeError, match="a bug in the image processor"):
        suite.run_scenario(path, ["fcfs"], engine="real", progress=False, real_engines={"vision": engine})
    assert engine.sending_when_stopped == []


class SlowStartEngine(FakeEngine):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.events = []

    async def start(self):
        self.events.append("start")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.events.append("start cancelled")
            raise

    async def stop(self):
        self.events.append("stop")


class BrokenStartEngine(SeeingEngine):
    async def start(self):
        raise EngineError("no such device")


def test_an_engine_that_fails_to_start_cancels_the_other_starts_before_any_stops(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(MIXED.replace("models:\n  vlm: {modality: vision}", "models:\n  vlm: {modality: vision}\n  llm: {}")
                    .replace("{vlm: vision}", "{vlm: vision, llm: text}")
                    .replace("chat: {model: vlm, images: 0,", "chat: {model: llm,"))
    slow = SlowStartEngine()
    with pytest.raises(EngineError, match="no such device"):
        suite.run_scenario(path, ["fcfs"], engine="real", progress=False,
                           real_engines={"text": slow, "vision": BrokenStartEngine()})
    assert slow.events == ["start", "start cancelled", "stop"]


def test_a_real_run_keeps_every_record_and_charge_however_long():
    ledger = suite._bench_arbiter("fcfs").ledger  # the default ledger keeps the last 100,000: a long run has more
    assert ledger.records.maxlen > 10**9 and ledger.charges.maxlen > 10**9
