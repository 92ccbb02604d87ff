import pytest

pytest.importorskip("vllm")
pytest.importorskip("openai")

pytestmark = pytest.mark.engine  # runs its own vLLM engine

from fairagents.bench import isolation


def test_isolation_measures_the_victim_idle_and_under_each_flood_with_and_without_the_cap():
    result = isolation.run(seconds=1.0, victim_tokens=4, flood_clients=8, flood_tokens=32, flood_queue=2, in_flight=4,
                           share=0.5)
    runs = result["runs"]
    assert [(r["flood"], r["share"], r["policy"], r["calls"]) for r in runs] == [
        (None, None, "hmfs", "chat"), ("honour", None, "hmfs", "chat"), ("honour", 0.5, "hmfs", "chat"),
        ("ignore", None, "hmfs", "chat"), ("ignore", 0.5, "hmfs", "chat"), ("ignore", None, "fcfs", "chat"),
        (None, None, "hmfs", "tool calls"), ("ignore", None, "hmfs", "tool calls")]
    assert result["in_flight"] == 4
    for r in runs:
        assert r["victim_requests"] > 0 and r["victim_failed"] == 0  # the victim is always served
        assert 0 < r["victim_p50_s"] <= r["victim_p99_s"]
    for r in runs[1:6] + runs[7:]:
        idle = runs[6] if r["calls"] == "tool calls" else runs[0]
        assert r["flood_done_per_s"] > 0 and r["flood_429_per_s"] > 0  # 8 clients, 4 slots, 2 queued: refusals
        assert r["p50_over_idle"] == pytest.approx(r["victim_p50_s"] / idle["victim_p50_s"])
        assert r["flood_tokens_per_s"] > 0 and 0.0 <= r["recompute_tax"] < 1.0
        assert r["victim_ttft_p99_s"] > 0 and r["flood_tpot_s"] > 0 and r["ttft_steps"] is not None
    assert runs[5]["fair_preemptions"] == 0  # fcfs keeps no counters: it never preempts for fairness
    ignoring, honouring = runs[3]["flood_429_per_s"], runs[1]["flood_429_per_s"]
    assert ignoring > honouring  # a flood that ignores Retry-After is refused far more often
    assert len(isolation.render(result)) == 1
