import pytest

pytest.importorskip("vllm")

from fairagents.bench import overhead  # noqa: E402


def test_overhead_reports_both_paths_and_the_sweep():
    result = overhead.run(callers=4, per_caller=1, max_tokens=8, rounds=1, sweep=(2, 4))
    assert result["default_in_flight"] == 32  # the embedded engine's batch capacity
    for path in ("direct", "arbiter"):
        assert result[path]["tokens_per_s"] > 0 and result[path]["ttft_p50_s"] > 0
    assert result["ratio"] == pytest.approx(result["arbiter"]["tokens_per_s"] / result["direct"]["tokens_per_s"])
    assert set(result["sweep"]) == {"2", "4"}
    assert result["smallest_limit_within_3pct_of_best"] in (2, 4)
    assert len(overhead.render(result)) == 2
