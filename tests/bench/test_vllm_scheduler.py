import pytest

pytest.importorskip("vllm")

from fairagents.bench import vllm_scheduler  # noqa: E402


def test_the_in_engine_queue_decision_cost_is_measured():
    # How it grows with the apps is the benchmark's to show (a ratio of timings is noise on a shared machine).
    small, large = vllm_scheduler.decision_cost(10, decisions=2000), vllm_scheduler.decision_cost(10_000, decisions=2000)
    assert 0 < small and 0 < large


def test_render_shows_every_mode():
    row = {"tokens_per_s": 100.0, "throughput_vs_vllm": 1.0, "gap_over_2u": 0.5, "victim_over_flood": 0.3,
           "victim_ttft_p50_s": 0.01, "victim_ttft_p99_s": 0.05}
    result = {"token_capacity": 2048, "victim_callers": 3, "flood_callers": 30, "rounds": 2, "seconds": 15.0,
              "u": 100.0, "decision_us": {"10": 3.0}, **{mode: row for mode in vllm_scheduler.MODES}}
    first, second = vllm_scheduler.render(result)
    assert len(first.rows) == len(vllm_scheduler.MODES) and len(second.rows) == 1
    result["tight"] = {"token_capacity": 256, "max_tokens": 64, "u": 50.0,
                       **{mode: row for mode in vllm_scheduler.TIGHT_MODES}}
    first, tight, second = vllm_scheduler.render(result)
    assert len(tight.rows) == len(vllm_scheduler.TIGHT_MODES) and "victim always waits" in tight.title


def test_render_says_when_a_window_measured_no_first_token():
    row = {"tokens_per_s": 100.0, "throughput_vs_vllm": 1.0, "gap_over_2u": 0.5, "victim_over_flood": None,
           "victim_ttft_p50_s": None, "victim_ttft_p99_s": None}
    result = {"token_capacity": 2048, "victim_callers": 3, "flood_callers": 30, "rounds": 1, "seconds": 1.0,
              "u": 100.0, "decision_us": {}, **{mode: row for mode in vllm_scheduler.MODES}}
    first, _ = vllm_scheduler.render(result)
    n = len(vllm_scheduler.MODES)
    assert [cell for cell in first.columns[6].cells] == ["—"] * n  # victim TTFT p99
    assert [cell for cell in first.columns[-1].cells] == ["0.0%"] * n  # no recompute without a preemption
