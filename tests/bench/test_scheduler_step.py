import pytest

pytest.importorskip("vllm")

pytestmark = pytest.mark.engine  # builds vLLM's schedulers (no model is loaded)

from fairagents.bench import scheduler_step


def test_both_schedulers_step_the_same_batch_and_the_fair_one_charges_each_client_its_tokens():
    plain, fair = scheduler_step._schedulers(8, 2, "hmfs")
    for scheduler in (plain, fair):
        step = scheduler_step._stepper(scheduler)
        for _ in range(4):
            step()
        assert len(scheduler.running) == 8 and len(scheduler.waiting) == 0  # 8 + 8 // 10 = 8 requests: all run
    seat = fair.seat
    assert set(seat.charged) == {"app0", "app1"} and seat.charged["app0"] == pytest.approx(seat.charged["app1"])
    assert {r.num_output_tokens for r in plain.running} == {r.num_output_tokens for r in fair.running} == {4}
    (cell,) = scheduler_step.run(running=(16,), clients=(4,), steps=2, rounds=1)["cells"]
    assert (cell["running"], cell["clients"]) == (16, 4) and cell["vllm_ms"] > 0 and cell["fair_ms"] > 0
    assert cell["overhead"] == pytest.approx(cell["fair_ms"] / cell["vllm_ms"] - 1)
