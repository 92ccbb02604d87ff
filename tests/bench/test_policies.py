import math

import pytest

from fairagents.bench import policies
from fairagents.identity import SLO
from fairagents.metrics import RequestRecord
from fairagents.request import Outcome


def test_every_policy_gets_a_row_of_bounded_metrics_and_hmfs_keeps_the_gap():
    result = policies.run(["fcfs", "hmfs"], seconds=60.0)
    assert set(result) == {"fcfs", "hmfs"}
    for row in result.values():
        assert set(row) == {"slo_attainment", "jain_safi", "gap_over_2u", "ttft_p99", "goodput", "esg"}
        for name in ("slo_attainment", "goodput", "esg"):
            assert 0 <= row[name] <= 1
        assert 0.25 <= row["jain_safi"] <= 1  # four apps: Jain's index is at least 1/4
        assert row["ttft_p99"] > 0
    assert result["hmfs"]["gap_over_2u"] <= 1 < result["fcfs"]["gap_over_2u"]
    assert len(policies.render(result).rows) == 2


def test_esg_and_goodput_follow_their_equations():
    def record(ttft, finished, slo, out=5):
        return RequestRecord("r", "a", "t", "m", 0.0, 0.0, ttft, finished, 10, out, Outcome.FINISHED, slo)

    on_time = record(0.5, 2.0, SLO(ttft=1.0, tpot=1.0, e2e=4.0))
    late = record(0.5, 8.0, SLO(e2e=4.0))  # TTLT twice its SLO: half its value
    missed_ttft = record(3.0, 4.0, SLO(ttft=1.0))
    assert policies.esg([on_time, late]) == pytest.approx((20 + 20 * 0.5) / 40)
    assert policies.goodput([on_time, late, missed_ttft]) == pytest.approx(2 / 3)
    assert math.isnan(policies.goodput([]))
    derived = record(0.5, 20.0, SLO(ttft=1.0, tpot=1.0))  # SLO_ttlt = 1 + 5 × 1 = 6 s against 20 s
    assert policies.esg([derived]) == pytest.approx(6 / 20)
