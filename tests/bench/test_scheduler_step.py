import pytest

pytest.importorskip("vllm")

pytestmark = pytest.mark.engine  # builds vLLM's schedulers (no model is loaded)

from fairagents.bench import scheduler_step


def test_both_schedulers_step_the_same_batch_and_the_overhead_is_their_ratio():
    result = scheduler_step.run(running=(16,), clients=(4,), steps=3, rounds=1)
    (cell,) = result["cells"]
    assert (cell["running"], cell["clients"]) == (16, 4) and cell["vllm_ms"] > 0 and cell["fair_ms"] > 0
    assert cell["overhead"] == pytest.approx(cell["fair_ms"] / cell["vllm_ms"] - 1)


def test_the_fair_scheduler_charges_each_client_what_its_requests_decoded():
    plain, fair = scheduler_step._schedulers(8, 2, "hmfs")
    step = scheduler_step._stepper(fair)
    for _ in range(4):
        step()
    seat = fair.seat
    assert set(seat.charged) == {"app0", "app1"} and seat.charged["app0"] == pytest.approx(seat.charged["app1"])
    assert len(fair.running) == 8 and len(fair.waiting) == 0  # 8 + 8 // 10 = 8 requests: all run
