import dataclasses

import pytest

from fairagents.admission import Statera
from fairagents.bench import simulator
from fairagents.engines import SimEngine
from fairagents.errors import InvalidParameterError
from fairagents.simulation import simulate

CELL_KEYS = {"clients", "rate", "requests", "cancelled", "steps", "tokens", "simulated_s", "wall_s", "ratio",
             "requests_per_s", "steps_per_s", "tokens_per_s"}


def test_run_reports_the_cost_of_every_cell():
    result = simulator.run(clients=(3, 6), rates=(4.0, 8.0), minutes=1, repeats=1)
    assert {k: result[k] for k in ("policy", "minutes", "seed", "repeats")} == {
        "policy": "hmfs", "minutes": 1, "seed": 0, "repeats": 1}
    assert [(c["clients"], c["rate"]) for c in result["cells"]] == [(3, 4.0), (3, 8.0), (6, 4.0), (6, 8.0)]
    for cell in result["cells"]:
        assert set(cell) == CELL_KEYS
        assert cell["requests"] > 0 and cell["steps"] > 0 and cell["tokens"] > 0 and cell["wall_s"] > 0
        assert 0 <= cell["cancelled"] <= cell["requests"]
        assert cell["simulated_s"] > simulator.SENDING / 2  # traffic comes for most of the round
        assert cell["ratio"] == pytest.approx(cell["simulated_s"] / cell["wall_s"]) and cell["ratio"] > 0
        assert cell["requests_per_s"] == pytest.approx(cell["requests"] / cell["wall_s"])
    more = {c["clients"]: c["requests"] for c in result["cells"] if c["rate"] == 8.0}
    assert more[6] > more[3]
    tables = simulator.render(result)
    assert [len(t.rows) for t in tables] == [4, 2]


def test_the_workload_has_exfairs_vi_shape():
    work, engines = simulator.exfairs_vi_workload(minutes=2)
    assert len({r.agent.app.name for r in work.requests}) == 50
    assert {r.agent.app.weight for r in work.requests} == {1.0}
    assert {r.agent.effective_slo.e2e for r in work.requests} == set(simulator.SLOS)
    assert all(r.at % simulator.ROUND < simulator.SENDING for r in work.requests)
    assert all(r.cancel_at == r.at + simulator.TIMEOUT and 1 <= r.output_tokens <= r.max_tokens == 256
               for r in work.requests)
    assert any(r.prompt_tokens >= 2_000 for r in work.requests) and any(r.prompt_tokens < 200 for r in work.requests)
    assert 2 * 50 * 3 <= len(work) <= 2 * 50 * 5  # about 4 a client and round
    assert engines["llama"].max_running == simulator.BATCH_AT_PAPER_LOAD
    assert simulator.exfairs_vi_workload(clients=100, rate=8.0)[1]["llama"].max_running == 4 * 12


@pytest.mark.parametrize("policy", ["hmfs", "vtc", "fcfs", "exfairs", "adaptive"])
def test_a_seeded_simulation_is_reproducible_bit_for_bit(policy):
    def run():
        work, engines = simulator.exfairs_vi_workload(clients=10, minutes=1, seed=3)
        return simulate(work, policy, engines)

    first, second = run(), run()
    assert first.records and first.charges
    assert first.records == second.records  # dataclass equality: floats compared exactly
    assert first.charges == second.charges
    assert first.dispatch_order == second.dispatch_order and first.end == second.end


def test_a_seeded_run_with_admission_on_paged_engines_is_reproducible_bit_for_bit():
    def run():
        work, engines = simulator.exfairs_vi_workload(clients=10, minutes=1, seed=4)
        paged = {m: SimEngine(e.profile, max_running=e.max_running, kv_capacity=12_000, jitter=0.05, seed=4,
                              kv="paged") for m, e in engines.items()}
        return simulate(work, "hmfs", paged, admission=Statera(), pool_running=6)

    first, second = run(), run()
    assert [dataclasses.astuple(r) for r in first.records] == [dataclasses.astuple(r) for r in second.records]
    assert first.charges == second.charges and first.preemptions == second.preemptions


def test_a_client_sends_about_four_fifths_of_its_rate_a_round_plus_one_half():
    work, _ = simulator.exfairs_vi_workload(clients=50, minutes=10, rate=4.0)
    per_round = len(work) / (50 * 10)
    assert per_round == pytest.approx(0.8 * 4.0 + 0.5, abs=0.15)  # as the docstring says, not 4 a round


@pytest.mark.parametrize(("call", "match"), [
    (lambda: simulator.measure(3, 4.0, minutes=1, repeats=0), "repeats must be an integer ≥ 1, got 0"),
    (lambda: simulator.measure(3, 0.0, minutes=1, repeats=1), "rate must be a finite number"),
    (lambda: simulator.measure(3, -4.0, minutes=1, repeats=1), "rate must be a finite number"),
    (lambda: simulator.exfairs_vi_workload(clients=3, rate=float("nan")), "rate must be a finite number"),
    (lambda: simulator.exfairs_vi_workload(clients=0), "clients must be an integer ≥ 1"),
    (lambda: simulator.run(clients=(3,), rates=(4.0, 0.0), minutes=1, repeats=1), "rate must be a finite number"),
])
def test_bad_arguments_are_parameter_errors(call, match):
    with pytest.raises(InvalidParameterError, match=match):
        call()
