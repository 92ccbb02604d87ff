import csv
import json
import textwrap
from pathlib import Path

import pytest

from fairagents.bench.spec import (
    Scenario,
    ScenarioError,
    build,
    builtin_scenarios,
    load_scenario,
    scenario_json_schema,
)
from fairagents.errors import InvalidParameterError
from fairagents.identity import SLO
from fairagents.simulation import simulate

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
name: tiny
description: Two apps on one model.
duration: 100
seed: 3
models:
  chat: {max_running: 8, kv_capacity: 4096}
apps:
  shop:
    weight: 2
    slo: {ttft: 2}
    agents:
      bot:
        model: chat
        weight: 3
        slo: {e2e: 10}
        arrival: {process: poisson, rate: 2}
        prompt: {dist: uniform, low: 10, high: 20}
        output: 8
        timeout: 30
  news:
    agents:
      reader:
        model: chat
        arrival: {process: gamma, rate: 1, cv: 2}
        prompt: 64
        output: {dist: lognormal, median: 50, sigma: 0.5, max: 100}
        max_tokens: 64
"""


def write(tmp_path, text, name="scenario.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return info.value


def test_a_good_file_loads_with_its_values_and_defaults(tmp_path):
    scenario = load_scenario(write(tmp_path, GOOD))
    assert isinstance(scenario, Scenario) and scenario.name == "tiny" and scenario.seed == 3
    assert scenario.models["chat"].max_running == 8 and scenario.models["chat"].d_model == 4096
    bot = scenario.apps["shop"].agents["bot"]
    assert bot.arrival.rate == 2 and bot.prompt.low == 10 and bot.output == 8 and bot.timeout == 30
    assert scenario.pool is None and scenario.real is None and scenario.policies is None


def test_the_workload_has_real_identities_slos_weights_and_timeouts(tmp_path):
    built = build(load_scenario(write(tmp_path, GOOD)))
    assert set(built.apps) == {"shop", "news"} and built.apps["shop"].weight == 2.0
    assert built.pool_running is None and built.duration == 100 and built.real_models == {}
    shop = [r for r in built.workload.requests if r.agent.app.name == "shop"]
    news = [r for r in built.workload.requests if r.agent.app.name == "news"]
    assert 150 < len(shop) < 250 and 60 < len(news) < 140
    bot = shop[0].agent
    assert bot.weight == 3.0 and bot.slo == SLO(e2e=10.0) and bot.app.slo == SLO(ttft=2.0)
    assert all(10 <= r.prompt_tokens <= 20 and r.output_tokens == 8 and r.max_tokens is None for r in shop)
    assert all(r.cancel_at == pytest.approx(r.at + 30) for r in shop)
    assert all(r.max_tokens == 64 and 1 <= r.output_tokens <= 64 and r.cancel_at is None for r in news)
    assert "weight" not in news[0].agent.declared  # an unstated weight stays the default
    times = [r.at for r in built.workload.requests]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 100
    result = simulate(built.workload, "hmfs", built.engines, apps=built.apps)
    assert len(result.records) == len(built.workload)


def test_the_same_seed_gives_the_same_workload(tmp_path):
    scenario = load_scenario(write(tmp_path, GOOD))
    a, b = build(scenario), build(scenario)
    assert a.workload.requests == b.workload.requests
    assert build(scenario, seed=3).workload.requests == a.workload.requests  # the scenario's seed is 3
    assert build(scenario, seed=4).workload.requests != a.workload.requests


def test_an_agent_draws_the_same_requests_whatever_the_other_agents(tmp_path):
    scenario = load_scenario(write(tmp_path, GOOD))
    alone = scenario.model_copy(update={"apps": {"shop": scenario.apps["shop"]}})
    shop = [r for r in build(scenario).workload.requests if r.agent.app.name == "shop"]
    assert build(alone).workload.requests == shop


def test_scale_multiplies_every_rate(tmp_path):
    scenario = load_scenario(write(tmp_path, GOOD)).model_copy(update={"duration": 2000.0})
    base, double = len(build(scenario).workload), len(build(scenario, scale=2.0).workload)
    assert double / base == pytest.approx(2.0, rel=0.06)
    with pytest.raises(InvalidParameterError):
        build(scenario, scale=0)
    with pytest.raises(InvalidParameterError):
        build(scenario, engine="gpu")


def test_count_replicates_apps_and_agents_cycling_listed_values(tmp_path):
    scenario = load_scenario(write(tmp_path, """\
        name: replicas
        duration: 600
        models: {m: {kv_capacity: 20000}}
        apps:
          mix:
            count: 3
            agents:
              user:
                model: m
                arrival: {process: exfairs, qpm: [10, 20]}
                slo: {e2e: [5, 8, 10, 12]}
                prompt: 8
                output: 4
          team:
            agents:
              worker:
                count: 2
                model: m
                arrival: {process: poisson, rate: [0.5, 1.5]}
                prompt: 8
                output: 4
        """))
    built = build(scenario)
    assert sorted(built.apps) == ["mix-0", "mix-1", "mix-2", "team"]
    by_agent = {}
    for r in built.workload.requests:
        by_agent.setdefault((r.agent.app.name, r.agent.name), []).append(r)
    assert set(by_agent) == {("mix-0", "user"), ("mix-1", "user"), ("mix-2", "user"), ("team", "worker-0"),
                             ("team", "worker-1")}
    assert [by_agent[(f"mix-{k}", "user")][0].agent.slo.e2e for k in range(3)] == [5, 8, 10]
    counts = [len(by_agent[(f"mix-{k}", "user")]) for k in range(3)]
    assert counts[1] > 1.6 * counts[0] and counts[2] < 0.6 * counts[1]  # QPM 10, 20, 10
    assert len(by_agent[("team", "worker-1")]) > 2 * len(by_agent[("team", "worker-0")])


def test_lengths_are_cut_to_max_tokens_and_the_models_context(tmp_path):
    scenario = load_scenario(write(tmp_path, """\
        name: long
        duration: 50
        models: {m: {kv_capacity: 1000, max_model_len: 600}}
        apps:
          a:
            agents:
              big:
                model: m
                arrival: {process: poisson, rate: 4}
                prompt: {dist: uniform, low: 500, high: 900}
                output: {dist: uniform, low: 50, high: 200}
                max_tokens: 100
        """))
    requests = build(scenario).workload.requests
    assert all(r.output_tokens <= 100 and r.prompt_tokens <= 500 and r.max_tokens == 100 for r in requests)
    simulate(build(scenario).workload, "fcfs", build(scenario).engines)  # every request fits


def test_real_engines_compress_the_timeline_and_cut_lengths(tmp_path):
    path = write(tmp_path, GOOD.replace("duration: 100", "duration: 1000") + """\
real:
  duration: 50
  rate_scale: 0.5
  max_prompt: 12
  max_output: 4
  slo_scale: 0.5
  models: {chat: text}
""")
    scenario = load_scenario(path)
    built = build(scenario, engine="real")
    requests = built.workload.requests
    assert built.engines == {} and built.real_models == {"chat": "text"} and built.duration == 50
    assert all(r.at < 50 and r.prompt_tokens <= 12 and r.output_tokens <= 4 for r in requests)
    assert len(requests) == pytest.approx((2 + 1) * 0.5 * 50, rel=0.3)  # the rates x 0.5, for 50 s
    shop = next(r for r in requests if r.agent.app.name == "shop")
    assert shop.agent.slo == SLO(e2e=5.0) and shop.agent.app.slo == SLO(ttft=1.0)
    assert shop.cancel_at == pytest.approx(shop.at + 15)
    assert all(r.max_tokens == 4 for r in requests if r.agent.app.name == "news")
    assert built.images == {("shop", "bot"): 0, ("news", "reader"): 0}


def test_a_scenario_without_a_real_block_has_no_real_version(tmp_path):
    with pytest.raises(ScenarioError, match="no real-engine version"):
        build(load_scenario(write(tmp_path, GOOD)), engine="real")


# ----------------------------------------------------------------------------- errors


def test_an_out_of_range_value_names_the_file_the_field_path_and_the_line(tmp_path):
    err = error_of(tmp_path, GOOD.replace("arrival: {process: poisson, rate: 2}", "arrival: {process: poisson, rate: -2}"))
    assert isinstance(err, InvalidParameterError) and isinstance(err, ValueError)
    assert str(err) == f"{tmp_path / 'scenario.yaml'}:16: apps.shop.agents.bot.arrival.rate: " \
                       "Input should be greater than 0 (got -2)"
    assert [tuple(p) for p in err.problems] == [("apps.shop.agents.bot.arrival.rate", 16,
                                                 "Input should be greater than 0 (got -2)")]


def test_an_unknown_field_is_refused_at_its_line(tmp_path):
    err = error_of(tmp_path, GOOD.replace("        timeout: 30\n", "        timeout: 30\n        colour: red\n"))
    assert err.problems[0].path == "apps.shop.agents.bot.colour" and err.problems[0].line == 20
    assert "Extra inputs are not permitted" in str(err)


def test_a_wrong_type_is_refused_at_its_line(tmp_path):
    err = error_of(tmp_path, GOOD.replace("max_running: 8", "max_running: many"))
    assert err.problems[0][:2] == ("models.chat.max_running", 6)
    assert "valid integer" in err.problems[0].message and "'many'" in err.problems[0].message


def test_a_length_distribution_error_names_the_distribution_field(tmp_path):
    err = error_of(tmp_path, GOOD.replace("{dist: uniform, low: 10, high: 20}", "{dist: uniform, low: 10, high: 5}"))
    assert err.problems[0][:2] == ("apps.shop.agents.bot.prompt.high", 17)
    err = error_of(tmp_path, GOOD.replace("{dist: uniform, low: 10, high: 20}", "{dist: lognormal, sigma: 1}"))
    assert err.problems[0].path == "apps.shop.agents.bot.prompt"
    assert "exactly one of median and mu" in err.problems[0].message


def test_an_unknown_model_reference_is_refused(tmp_path):
    err = error_of(tmp_path, GOOD.replace("        model: chat\n        weight: 3", "        model: chta\n        weight: 3"))
    assert err.problems[0][:2] == ("apps.shop.agents.bot.model", 13)
    assert "unknown model 'chta'; known models: chat" in str(err)


def test_a_missing_field_is_named(tmp_path):
    err = error_of(tmp_path, GOOD.replace("duration: 100\n", ""))
    assert err.problems[0][:2] == ("duration", 1) and "Field required" in str(err)
    err = error_of(tmp_path, GOOD.replace("        prompt: 64\n", ""))
    assert err.problems[0].path == "apps.news.agents.reader" and "needs prompt" in str(err)


def test_several_problems_are_all_reported_in_line_order(tmp_path):
    err = error_of(tmp_path, GOOD.replace("weight: 2", "weight: 0").replace("rate: 1, cv: 2", "rate: 1, cv: -2"))
    assert [(p.path, p.line) for p in err.problems] == [("apps.shop.weight", 9),
                                                        ("apps.news.agents.reader.arrival.cv", 24)]
    assert str(err).splitlines()[0].endswith("2 problems")


def test_a_yaml_syntax_error_gives_its_line(tmp_path):
    err = error_of(tmp_path, GOOD.replace("    weight: 2\n", "    weight: [2\n"))
    assert err.problems[0].line == 10 and "YAML syntax error" in str(err)
    assert str(err).startswith(f"{tmp_path / 'scenario.yaml'}:10: ")


@pytest.mark.parametrize(("text", "line", "match"), [
    ("- a list\n", 1, "mapping"),
    (GOOD.replace("  news:\n", "  shop:\n"), 20, "duplicate key 'shop'"),
    (GOOD.replace("rate: 2}", "rate: [1, 2]}"), 16, "count"),
    (GOOD.replace("rate: 2}", "rate: 2, extra: 1}"), 16, "extra"),
    (GOOD.replace("{process: poisson, rate: 2}", "{process: poison, rate: 2}"), 16, "poison"),
    (GOOD.replace("{process: poisson, rate: 2}", "{process: formula, expr: \"__import__('os')\"}"), 16,
     "may only use"),
    (GOOD + "policies: [hmfs, fifo]\n", 28, "unknown policy 'fifo'"),
    (GOOD + "real: {duration: 10, models: {}}\n", 28, "at least 1 item"),
    (GOOD.replace("models:\n  chat: {max_running: 8, kv_capacity: 4096}", "models:\n  chat: {}\n  other: {}")
     + "real: {duration: 10, models: {chat: text}}\n", 29, "no real engine named for model(s) other"),
    (GOOD.replace("max_tokens: 64", "max_tokens: 5000"), 27, "leaves no room"),
    (GOOD.replace("timeout: 30", "timeout: 30\n        start: 200"), 20, "not before the scenario's end"),
])
def test_other_mistakes_are_refused_with_their_line(tmp_path, text, line, match):
    err = error_of(tmp_path, text)
    assert err.problems[0].line == line
    assert match in str(err)


@pytest.mark.parametrize(("old", "new", "path", "line", "match"), [
    ("rate: 2}", "rate: .inf}", "apps.shop.agents.bot.arrival.rate", 16, "finite number"),
    ("timeout: 30", "timeout: .nan", "apps.shop.agents.bot.timeout", 19, "finite number"),
    ("sigma: 0.5", "sigma: .inf", "apps.news.agents.reader.output.sigma", 26, "finite number"),
    ("seed: 3", "seed: -1", "seed", 4, "greater than or equal to 0"),
    ("high: 20}", "high: 1e23}", "apps.shop.agents.bot.prompt.high", 17, "valid integer"),
    ("output: 8\n", "output: 100000000000000000000000\n", "apps.shop.agents.bot.output", 18,
     "less than or equal to 2147483647"),
    ("{process: poisson, rate: 2}", '{process: formula, expr: "1' + '+1' * 999 + '"}',
     "apps.shop.agents.bot.arrival.expr", 16, "nest at most 100"),
    ("{process: poisson, rate: 2}", '{process: formula, expr: "' + '9' * 400 + '"}',
     "apps.shop.agents.bot.arrival.expr", 16, "too large for a float"),
])
def test_values_that_would_break_the_build_are_refused_at_their_field_and_line(tmp_path, old, new, path, line, match):
    assert old in GOOD
    err = error_of(tmp_path, GOOD.replace(old, new, 1))
    assert err.problems[0][:2] == (path, line) and match in err.problems[0].message


def test_a_negative_seed_given_to_build_is_a_parameter_error(tmp_path):
    with pytest.raises(InvalidParameterError, match="seed must be an integer ≥ 0, got -1"):
        build(load_scenario(write(tmp_path, GOOD)), seed=-1)


def test_yaml_1_2_floats_load_as_numbers(tmp_path):
    scenario = load_scenario(write(tmp_path, GOOD.replace(
        "kv_capacity: 4096}", "kv_capacity: 4096, prefill_per_token: 2e-5, decode_base: 4E-3}"
    ).replace("rate: 2}", "rate: 1e0}")))
    assert scenario.models["chat"].prefill_per_token == 2e-5 and scenario.models["chat"].decode_base == 0.004
    assert scenario.apps["shop"].agents["bot"].arrival.rate == 1.0
    assert scenario.seed == 3 and isinstance(scenario.seed, int)  # integers stay integers


def test_a_scenario_file_that_is_not_utf8_names_its_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(GOOD.replace("Two apps on one model.", "Deux apps, \xe9t\xe9.").encode("latin-1"))
    with pytest.raises(ScenarioError, match=r"latin1\.yaml:2: not UTF-8"):
        load_scenario(path)


def test_yaml_aliases_work_but_one_inside_itself_or_a_bomb_is_refused_with_its_line(tmp_path):
    shared = GOOD.replace("slo: {ttft: 2}", "slo: &fast {ttft: 2}").replace("  news:\n", "  news:\n    slo: *fast\n")
    scenario = load_scenario(write(tmp_path, shared))
    assert scenario.apps["news"].slo == scenario.apps["shop"].slo is not None
    err = error_of(tmp_path, GOOD + "policies: &a [*a]\n")
    assert err.problems[0].line == 28 and "alias refers to a value that contains it" in str(err)
    err = error_of(tmp_path, GOOD + "extra: &d {a: {b: *d}}\n")
    assert err.problems[0].line == 28 and "contains it" in str(err)
    bomb = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 12))
    err = error_of(tmp_path, GOOD + "l0: &l0 [fcfs]\n" + bomb)
    assert "expand this value past 100,000 values" in str(err)


def test_a_bad_lengths_file_is_refused_at_load_naming_the_field_and_the_file_s_line(tmp_path):
    text = GOOD.replace("prompt: {dist: uniform, low: 10, high: 20}", "prompt: {dist: empirical, path: lens.txt}")
    (tmp_path / "lens.txt").write_text("12\nmany\n")
    err = error_of(tmp_path, text)
    assert err.problems[0][:2] == ("apps.shop.agents.bot.prompt.path", 17)
    assert f"{tmp_path / 'lens.txt'}:2: a length must be an integer" in str(err)
    (tmp_path / "lens.txt").write_bytes(b"12\n\xff\n")
    err = error_of(tmp_path, text)
    assert err.problems[0][:2] == ("apps.shop.agents.bot.prompt.path", 17) and "not UTF-8" in str(err)
    (tmp_path / "lens.txt").write_text("12\n")
    scenario = load_scenario(write(tmp_path, text))
    (tmp_path / "lens.txt").write_text("0\n")  # edited after loading: the build says so
    with pytest.raises(ScenarioError, match=r"tiny: apps\.shop\.agents\.bot: .*lens\.txt:1"):
        build(scenario)


def test_a_missing_file_or_unknown_name_is_refused(tmp_path):
    with pytest.raises(ScenarioError, match="scenario file not found"):
        load_scenario(tmp_path / "absent.yaml")
    with pytest.raises(ScenarioError, match="unknown scenario 'vtc-overlod': not a built-in"):
        load_scenario("vtc-overlod")


def test_on_and_off_are_keys_not_booleans(tmp_path):
    scenario = load_scenario(write(tmp_path, GOOD.replace(
        "{process: poisson, rate: 2}", "{process: onoff, on: 5, off: 15, base: {process: poisson, rate: 2}}")))
    arrival = scenario.apps["shop"].agents["bot"].arrival
    assert (arrival.on, arrival.off) == (5, 15)
    assert all(r.at % 20 < 5 for r in build(scenario).workload.requests if r.agent.app.name == "shop")


def test_empirical_lengths_are_read_relative_to_the_scenario_file(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "lens.csv").write_text("prompt,output\n11,3\n13,5\n")
    text = GOOD.replace("prompt: {dist: uniform, low: 10, high: 20}",
                        "prompt: {dist: empirical, path: data/lens.csv, column: prompt}")
    requests = build(load_scenario(write(tmp_path, text))).workload.requests
    assert {r.prompt_tokens for r in requests if r.agent.app.name == "shop"} == {11, 13}
    err = error_of(tmp_path, text.replace("data/lens.csv", "data/none.csv"))
    assert err.problems[0][:2] == ("apps.shop.agents.bot.prompt.path", 17) and "file not found" in str(err)


# ----------------------------------------------------------------------------- traces


TRACE_SCENARIO = """\
name: replay
duration: 100
models: {chat: {}, vision: {modality: vision}}
apps:
  shop:
    weight: 2
    agents:
      bot: {weight: 3, slo: {ttft: 1}, timeout: 9}
trace: {path: trace.csv}
"""


def test_a_trace_round_trips(tmp_path):
    rows = [(1000.5, "shop", "bot", "chat", 30, 7), (1001.0, "shop", "other", "chat", 10, 2),
            (1002.25, "guest", "solo", "vision", 400, 20), (1300.0, "guest", "solo", "chat", 5, 5)]
    with open(tmp_path / "trace.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["timestamp", "app", "agent", "model", "input_tokens", "output_tokens"])
        writer.writerows(rows)
    built = build(load_scenario(write(tmp_path, TRACE_SCENARIO)))
    got = [(r.at, r.agent.app.name, r.agent.name, r.model, r.prompt_tokens, r.output_tokens)
           for r in built.workload.requests]
    assert got == [(t - 1000.5, *rest) for t, *rest in rows[:3]]  # rebased; the last is past the duration
    bot, other, solo = (r.agent for r in built.workload.requests)
    assert (bot.weight, bot.slo, bot.app.weight) == (3.0, SLO(ttft=1.0), 2.0)
    assert built.workload.requests[0].cancel_at == pytest.approx(9.0)
    assert (other.weight, other.slo, other.app.weight) == (1.0, None, 2.0)  # undeclared agent: weight 1
    assert (solo.weight, solo.app.weight) == (1.0, 1.0) and set(built.apps) == {"shop", "guest"}
    # Written back out, the workload replays as itself.
    with open(tmp_path / "trace.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["timestamp", "app", "agent", "model", "input_tokens", "output_tokens"])
        writer.writerows(got)
    again = build(load_scenario(write(tmp_path, TRACE_SCENARIO)))
    assert again.workload.requests == built.workload.requests
    faster = build(load_scenario(write(tmp_path, TRACE_SCENARIO)), scale=2.0).workload.requests
    assert [r.at for r in faster] == [0.0, 0.25, 0.875]
    simulate(built.workload, "hmfs", built.engines, apps=built.apps)


def test_a_bad_trace_names_its_line(tmp_path):
    (tmp_path / "trace.csv").write_text("timestamp,app,agent,model,input_tokens,output_tokens\n0,a,b,chat,5,5\n"
                                        "1,a,b,chat,five,5\n")
    with pytest.raises(ScenarioError, match=r"trace\.csv:3"):
        build(load_scenario(write(tmp_path, TRACE_SCENARIO)))
    (tmp_path / "trace.csv").write_text("timestamp,app,agent,model,input_tokens,output_tokens\n0,a,b,llm,5,5\n")
    with pytest.raises(ScenarioError, match=r"trace\.csv:2: unknown model 'llm'"):
        build(load_scenario(write(tmp_path, TRACE_SCENARIO)))
    (tmp_path / "trace.csv").write_text("time,app\n0,a\n")
    with pytest.raises(ScenarioError, match="lacks column"):
        build(load_scenario(write(tmp_path, TRACE_SCENARIO)))


def test_every_trace_row_is_checked_at_load_even_past_the_duration(tmp_path):
    (tmp_path / "trace.csv").write_text("timestamp,app,agent,model,input_tokens,output_tokens\n0,a,b,chat,5,5\n"
                                        "5000,a,b,llm,5,5\n")
    with pytest.raises(ScenarioError, match=r"trace\.csv:3: unknown model 'llm'"):
        load_scenario(write(tmp_path, TRACE_SCENARIO))
    scenario = Scenario.model_validate({"name": "replay", "duration": 100, "models": {"chat": {}},
                                        "trace": {"path": str(tmp_path / "trace.csv")}})
    with pytest.raises(ScenarioError, match=r"trace\.csv:3: unknown model 'llm'"):
        build(scenario, scale=0.001)  # the row is neither kept nor within the duration: still an error


@pytest.mark.parametrize(("content", "match"), [
    (b"timestamp,app,agent,model,input_tokens,output_tokens\n0,\xe9,b,chat,5,5\n", "not UTF-8"),
    (b"timestamp,app,agent,model,input_tokens,output_tokens\n0,a,b,chat,5," + b"9" * 30 + b"\n",
     r"trace\.csv:2: .*token counts in \[1, 2147483647\]"),
    (b'timestamp,app,agent,model,input_tokens,output_tokens\n0,a,"' + b"b" * 200_000 + b'",chat,5,5\n',
     "field larger than field limit"),
])
def test_an_unreadable_trace_is_a_scenario_error(tmp_path, content, match):
    (tmp_path / "trace.csv").write_bytes(content)
    with pytest.raises(ScenarioError, match=match):
        load_scenario(write(tmp_path, TRACE_SCENARIO))


# ----------------------------------------------------------------------------- built-ins and schema


BUILTINS = sorted(builtin_scenarios())


def test_the_required_builtins_exist_with_descriptions():
    required = {"vtc-overload", "vtc-eight", "vtc-onoff", "duet", "hmas-stress", "hmas-burst", "hmas-drift",
                "hmas-shift", "hmfs-shared-pool", "hmfs-separate"} | {f"exfairs-{i}" for i in range(1, 7)}
    descriptions = builtin_scenarios()
    assert required <= set(descriptions) and list(descriptions) == sorted(descriptions)
    assert all(len(text) > 200 for text in descriptions.values())


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_loads_and_builds_for_both_engines(name):
    scenario = load_scenario(name)
    assert scenario.name == name and scenario.real is not None
    sim = build(scenario)
    assert sim.engines.keys() == scenario.models.keys() and len(sim.workload) > 100
    assert len(sim.workload) <= 30_000  # the simulator's cost stays sane
    real = build(scenario, engine="real")
    assert 30 <= real.duration <= 60 and set(real.real_models) == set(scenario.models)
    requests = real.workload.requests
    assert 0.5 <= len(requests) / real.duration <= 100  # about what the tiny CPU models serve, not more
    assert all(r.prompt_tokens <= 256 and r.output_tokens <= 64 and r.at < real.duration for r in requests)
    short = scenario.model_copy(update={"duration": 3.0})
    small = build(short)
    result = simulate(small.workload, "hmfs", small.engines, apps=small.apps, pool_running=small.pool_running)
    assert len(result.records) == len(small.workload) and result.idle_with_backlog == 0


def test_the_duet_text_requests_carry_no_image_on_real_engines():
    built = build(load_scenario("duet"), engine="real")
    assert built.images == {("text", "chat"): 0, ("multimodal", "caption"): 1}


def test_the_hmfs_builtins_differ_only_in_the_pool():
    shared, separate = load_scenario("hmfs-shared-pool"), load_scenario("hmfs-separate")
    assert shared.pool is not None and separate.pool is None
    assert shared.apps == separate.apps and shared.models == separate.models
    assert build(shared).workload.requests == build(separate).workload.requests


def test_the_schema_file_matches_the_models():
    path = ROOT / "docs" / "scenario.schema.json"
    assert json.loads(path.read_text()) == scenario_json_schema(), (
        "docs/scenario.schema.json is out of date; regenerate it with "
        "`python -m fairagents.bench.spec > docs/scenario.schema.json`")
