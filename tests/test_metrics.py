import math

import pytest

from fairagents import Outcome
from fairagents.metrics import (
    Charge,
    backlog_intervals,
    client_stats,
    exfairs_jain_index,
    jain_index,
    max_service_gap,
    percentile,
)
from fairagents.records import RequestRecord


def rec(app, arrival, dispatched, agent="t", model="m", finished=None, outcome=Outcome.FINISHED):
    return RequestRecord(
        f"{app}{arrival}{model}", app, agent, model, arrival, dispatched, dispatched,
        finished if finished is not None else (dispatched or arrival) + 1, 1, 1, outcome,
    )


def test_percentile_and_jain():
    assert math.isnan(percentile([], 50))
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0, 3.0], 100) == 3.0
    assert jain_index([]) == 1.0
    assert jain_index([2.0, 2.0]) == 1.0
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_exfairs_jain_variant_normalises_then_inverts():
    # Min-max normalised, 1 − y (smaller is better), then Jain's formula: any two unequal clients score 0.5.
    for pair in ([0.10, 0.11], [0.0, 1.0], [3.0, 1000.0]):
        assert exfairs_jain_index(pair) == 0.5
        assert exfairs_jain_index(pair, smaller_is_better=False) == 0.5
    assert jain_index([0.10, 0.11]) == pytest.approx(0.0441 / 0.0442)  # the standard index: nearly 1
    # SAFI 0.2, 0.5, 0.8 -> y 0, 0.5, 1 -> 1 − y = 1, 0.5, 0 -> 1.5² / (3 · 1.25) = 0.6
    assert exfairs_jain_index([0.2, 0.5, 0.8]) == pytest.approx(0.6)
    # One client worse than n − 1 equal ones: (n − 1)/n; one better than n − 1 equal ones: 1/n.
    assert exfairs_jain_index([0.1, 0.1, 0.1, 0.9]) == pytest.approx(0.75)
    assert exfairs_jain_index([0.1, 0.9, 0.9, 0.9]) == pytest.approx(0.25)
    assert exfairs_jain_index([0.1, 0.9, 0.9, 0.9], smaller_is_better=False) == pytest.approx(0.75)
    # Scale-free, unlike the standard index.
    assert exfairs_jain_index([1.0, 2.0, 4.0]) == exfairs_jain_index([10.0, 20.0, 40.0])
    assert exfairs_jain_index([1.0, 2.0, 4.0]) != pytest.approx(exfairs_jain_index([1.0, 3.0, 4.0]))
    assert exfairs_jain_index([]) == exfairs_jain_index([0.7]) == exfairs_jain_index([0.4, 0.4]) == 1.0


def test_backlog_of_cancelled_request_ends_when_it_ended():
    r = rec("a", 0.0, None, finished=2.0, outcome=Outcome.CANCELLED)
    assert backlog_intervals([r]) == {"a": [(0.0, 2.0)]}


def test_backlog_on_every_model():
    recs = [rec("a", 0.0, 4.0, model="m"), rec("a", 1.0, 2.0, model="n"), rec("a", 3.0, 5.0, model="n")]
    assert backlog_intervals(recs, models=["m", "n"]) == {"a": [(1.0, 2.0), (3.0, 4.0)]}


def test_gap_counts_only_joint_backlog():
    recs = [rec("x", 0.0, 10.0), rec("y", 5.0, 10.0)]
    charges = [Charge(1.0, "x", "t", 100.0), Charge(6.0, "x", "t", 3.0), Charge(7.0, "y", "t", 1.0)]
    assert max_service_gap(recs, charges, {"x": 1.0, "y": 1.0}) == 3.0


def test_gap_is_weight_normalised_and_agents_pair_within_an_app():
    recs = [rec("x", 0.0, 10.0, agent="p"), rec("x", 0.0, 10.0, agent="q"), rec("y", 0.0, 10.0)]
    charges = [Charge(1.0, "x", "p", 8.0), Charge(2.0, "x", "q", 2.0), Charge(3.0, "y", "t", 50.0)]
    assert max_service_gap(recs, charges, {"x/p": 4.0, "x/q": 1.0, "y/t": 1.0}, key="agent") == 2.0


def test_client_stats_window_and_shares():
    recs = [rec("x", 0.0, 1.0), rec("y", 0.0, 2.0)]
    charges = [Charge(1.0, "x", "t", 30.0), Charge(2.0, "y", "t", 10.0), Charge(9.0, "y", "t", 60.0)]
    stats = {s.name: s for s in client_stats(recs, charges, {"x": 3.0, "y": 1.0}, until=5.0)}
    assert stats["x"].share == 0.75 and stats["x"].weight_share == 0.75
    assert stats["y"].wait_p50 == 2.0


def test_client_stats_count_every_outcome_and_the_refused():
    recs = [rec("x", 0.0, 1.0), rec("x", 0.0, None, finished=2.0, outcome=Outcome.FAILED),
            rec("x", 1.0, None, finished=3.0, outcome=Outcome.CANCELLED)]
    (x,) = client_stats(recs, [], {"x": 1.0}, rejected={"x": 4})
    assert (x.done, x.failed, x.cancelled, x.rejected) == (1, 1, 1, 4)
    assert (x.queued, x.in_flight, x.slo_attainment) == (0, 0, None)
