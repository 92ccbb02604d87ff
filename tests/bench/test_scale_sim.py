import dataclasses
import math
import random
from array import array

import numpy as np
import pytest

from fairagents import Outcome
from fairagents.bench import scale_sim
from fairagents.bench.scale_sim import WALL_FIELDS, run_simulated, simulate_doors
from fairagents.errors import InvalidParameterError
from fairagents.metrics import Charge, max_service_gap
from fairagents.records import RequestRecord

SMALL = dict(replicas=4, slots_per_replica=4, agents=120, apps=6, seconds=2.0)
# Two doors, each seeing one app only: weights 4:1, each app able to fill the whole pool alone.
SPLIT = dict(replicas=2, slots_per_replica=4, agents=40, apps=2, weights=(4.0, 1.0), skew=1.0, seconds=3.0)


def without_wall_clock(row):
    return dataclasses.replace(row, **{name: 0.0 for name in WALL_FIELDS})


def test_the_same_seed_gives_the_same_row_apart_from_wall_clock_fields():
    first, again = simulate_doors(2, seed=3, **SPLIT), simulate_doors(2, seed=3, **SPLIT)
    assert without_wall_clock(first) == without_wall_clock(again)
    assert without_wall_clock(simulate_doors(2, seed=4, **SPLIT)) != without_wall_clock(first)


@pytest.mark.parametrize("doors", [1, 2, 4])
def test_the_gap_stays_within_two_u_plus_s(doors):
    row = simulate_doors(doors, **SMALL)
    assert row.served > 0
    assert (row.s == 0.0) == (doors == 1) and row.s >= 0
    assert row.bound == pytest.approx(2 * (row.u + row.s))  # the smallest weight is 1
    assert 0 < row.gap <= row.bound and row.ratio == pytest.approx(row.gap / row.bound)


def test_shared_counters_hold_four_to_one_where_counters_per_door_collapse_to_the_doors_split():
    shared = simulate_doors(2, **SPLIT)
    alone = simulate_doors(2, shared=False, **SPLIT)
    assert shared.service[0] / shared.service[1] == pytest.approx(4.0, rel=0.1)
    assert alone.service[0] / alone.service[1] == pytest.approx(1.0, rel=0.2)  # half the slots each
    assert shared.jain > 0.99 > alone.jain


@pytest.mark.parametrize("doors,shared", [(1, False), (3, False), (1, True), (2, True), (4, True)])
def test_the_replicas_are_never_handed_more_than_their_slots(doors, shared, monkeypatch):
    most = []
    start_step = scale_sim.SimEngine.start_step

    def counting(engine, now):  # every step, on the replicas' side: the batch never outgrows the engine
        assert engine.running <= engine.max_running
        most.append(engine.running)
        return start_step(engine, now)

    monkeypatch.setattr(scale_sim.SimEngine, "start_step", counting)
    row = simulate_doors(doors, shared=shared, **SMALL)
    assert row.peak_running <= row.slots and max(most) <= 4
    assert row.peak_running == row.slots  # closed loops keep the pool full at some point


@pytest.mark.parametrize("doors,shared", [(1, False), (2, False), (2, True), (4, True)])
def test_every_request_is_served_exactly_once(doors, shared, monkeypatch):
    admitted = []
    admit = scale_sim.SimEngine.admit

    def admitting(engine, req, output_tokens):
        admitted.append(req.id)
        return admit(engine, req, output_tokens)

    monkeypatch.setattr(scale_sim.SimEngine, "admit", admitting)
    row = simulate_doors(doors, shared=shared, **SMALL)
    assert len(admitted) == len(set(admitted))  # no request reaches a replica twice
    assert row.served_twice == 0
    assert row.served + row.in_flight == row.requests
    assert row.served <= len(admitted) <= row.requests


def test_run_simulated_puts_the_plain_hmfs_baseline_first():
    rows = run_simulated((1, 2), replicas=2, slots_per_replica=2, agents=20, apps=2, seconds=1.0)
    assert [(r.doors, r.shared) for r in rows] == [(1, False), (1, True), (2, True)]
    baseline = rows[0]
    assert baseline.syncs == 0 and math.isnan(baseline.sync_p50_us) and baseline.s == 0.0
    assert all(r.syncs > 0 and r.payload_bytes > 0 and r.dispatch_p50_us > 0 for r in rows[1:])


def test_the_vectorised_gap_is_the_metrics_gap():
    rng = random.Random(7)
    weights = np.array([1.0, 2.0, 4.0])
    times, who, amounts = array("d"), array("i"), array("d")
    for _ in range(400):
        times.append(round(rng.uniform(0, 10), 1))  # repeated instants, as steps charge many at once
        who.append(rng.randrange(3))
        amounts.append(rng.uniform(1, 50))
    spans = [[(s, s + rng.uniform(0, 2)) for s in (rng.uniform(0, 10) for _ in range(12))] for _ in range(3)]
    records = [RequestRecord(f"{i}-{k}", f"app-{i}", "t", "chat", start, stop, stop, stop + 1, 1, 1, Outcome.FINISHED)
               for i, of_app in enumerate(spans) for k, (start, stop) in enumerate(of_app)]
    charges = [Charge(t, f"app-{i}", "t", a) for t, i, a in zip(times, who, amounts, strict=True)]
    expected = max_service_gap(records, charges, {f"app-{i}": w for i, w in enumerate(weights)})
    assert expected > 0
    assert scale_sim._max_gap(times, who, amounts, weights, spans) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("bad", [dict(doors=0), dict(agents=3, apps=4), dict(skew=0.0), dict(warmup=2.0),
                                 dict(interval=0.0), dict(delay=-1.0), dict(doors=9, shared=False)])
def test_bad_settings_are_refused(bad):
    settings = dict(doors=2, replicas=2, slots_per_replica=4, agents=20, apps=2, seconds=2.0) | bad
    with pytest.raises(InvalidParameterError):
        simulate_doors(settings.pop("doors"), **settings)


def test_doors_sharing_apps_keep_the_pool_busy():
    row = simulate_doors(2, replicas=2, slots_per_replica=2, agents=40, apps=4, seconds=2.0)
    assert row.busy > 0.8
