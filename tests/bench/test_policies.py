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
    assert policies.goodput([on_time, late, missed_ttft]) == pytest.approx(1 / 2)  # late has no TTFT or TPOT SLO
    assert math.isnan(policies.goodput([]))
    derived = record(0.5, 20.0, SLO(ttft=1.0, tpot=1.0))  # SLO_ttlt = 1 + 5 × 1 = 6 s against 20 s
    assert policies.esg([derived]) == pytest.approx(6 / 20)


def test_a_metric_over_slos_counts_only_the_requests_with_the_slo_it_checks():
    def record(ttft, finished, slo, outcome=Outcome.FINISHED):
        return RequestRecord("r", "a", "t", "m", 0.0, 0.0, ttft, finished, 10, 5, outcome, slo)

    free = record(500.0, 600.0, None)  # ten minutes to a first token, and no SLO to miss
    e2e_only = record(0.5, 2.0, SLO(e2e=4.0))
    missed = record(3.0, 4.0, SLO(ttft=1.0))
    for metric in (policies.slo_attainment, policies.goodput, policies.esg):
        assert math.isnan(metric([free, free])), metric.__name__
    assert math.isnan(policies.goodput([free, e2e_only]))  # no TTFT or TPOT SLO to check
    assert policies.slo_attainment([free, e2e_only, missed]) == pytest.approx(1 / 2)
    assert policies.goodput([free, e2e_only, missed]) == 0.0
    assert policies.esg([free, e2e_only]) == 1.0
    assert math.isnan(policies.esg([missed]))  # a TTFT SLO alone sets no time-to-last-token target


def test_the_table_shows_a_dash_where_a_metric_is_undefined():
    row = {"slo_attainment": None, "goodput": None, "jain_safi": 0.9, "gap_over_2u": 0.05, "ttft_p99": 591.3,
           "esg": None}
    assert [column._cells[0] for column in policies.render({"fcfs": row}).columns] == [
        "fcfs", "—", "—", "0.900", "0.05", "591.30 s", "—"]
