import pytest

pytest.importorskip("vllm")

pytestmark = pytest.mark.engine  # runs its own vLLM engines

from fairagents.bench import overhead


def test_overhead_reports_both_paths_the_sweep_and_kv_pressure():
    result = overhead.run(callers=4, per_caller=1, max_tokens=8, rounds=1, sweep=(2, 4), kv_seconds=1.5,
                          sweep_load=(1, 1, 8))
    assert result["default_in_flight"] == result["default_max_num_seqs"] == 128  # vLLM's own batch on a CPU
    for path in ("direct", "arbiter"):
        assert result[path]["tokens_per_s"] > 0 and result[path]["ttft_p50_s"] > 0
    assert result["ratio"] == pytest.approx(result["arbiter"]["tokens_per_s"] / result["direct"]["tokens_per_s"])
    assert set(result["sweep"]) == {"2", "4"}
    assert result["smallest_limit_within_3pct_of_best"] in (2, 4)
    kv = result["kv_pressure"]
    assert kv["kv_cache_bytes"] == overhead.pressure_kv_bytes()
    assert kv["requests_held"] == overhead.PRESSURE_HOLDS  # the KV cache was sized as meant
    assert kv["token_capacity"] == kv["token_budget"]["token_budget"]  # the default budget is the KV capacity
    assert kv["request_count"]["token_budget"] is None and kv["request_count"]["in_flight"] == 128
    for mode in ("token_budget", "request_count"):
        row = kv[mode]
        assert row["tokens_per_s"] > 0 and row["output_tokens"] > 0
        for app in ("victim", "flood"):  # a window in which an app had no first token (a busy machine) says so
            assert (row[f"{app}_ttft_p50_s"] is None) == (row[f"{app}_first_tokens"] == 0)
            assert row[f"{app}_ttft_p50_s"] is None or row[f"{app}_ttft_p50_s"] > 0
        assert row["victim_over_flood"] is None or row["victim_over_flood"] >= 0
        assert row["gap_over_2u"] == pytest.approx(row["max_gap"] / (2 * kv["u"]))
    assert len(overhead.render(result)) == 3
