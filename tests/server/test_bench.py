"""``fairagents bench server``: both paths measured on one engine, in one run (a small load)."""

import pytest

from fairagents.bench import server

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]


async def test_bench_server_reports_both_paths(text_engine):
    result = await server._run(text_engine, callers=4, per_caller=2, max_tokens=8, rounds=1)
    assert result["load"] == {"callers": 4, "requests": 8, "max_tokens": 8}
    for path in ("in_process", "http"):
        r = result[path]
        assert r["requests_per_s"] > 0 and r["tokens_per_s"] == pytest.approx(8 * r["requests_per_s"])
        assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"]
    assert result["ratio"] == pytest.approx(result["http"]["requests_per_s"] / result["in_process"]["requests_per_s"])
    (table,) = server.render(result)
    assert table.row_count == 2
