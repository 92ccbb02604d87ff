"""The model's side of H-MAS's meta controller: the decision's validation, the prompt, and asking a model."""

import asyncio
import inspect
import json

import pytest

import fairagents as fa
from fairagents.runtime.sampling import ChatArgs
from fairagents.policies.adaptive import Adaptive
from fairagents.policies.decision import DESCRIPTIONS, Decision, decision_prompt, parse_decision
from fairagents.runtime.selector import ModelSelector

POOL = ("fcfs", "edf", "sjf", "two_lane", "wfq")


# -- parse_decision ------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    '{"policy": "edf", "reason": "deadline misses"}',
    '  {"policy":"edf","reason":"deadline misses"}\n',
    '```json\n{"policy": "edf", "reason": "deadline misses"}\n```',
    'Looking at the violations, {"policy": "edf", "reason": "deadline misses"} is my answer.',
    'Not {this}, nor {"unclosed": , but {"policy": "edf", "reason": "deadline misses"} {"policy": "wfq"}',
])
def test_a_decision_is_read_alone_fenced_or_in_prose(text):
    assert parse_decision(text, POOL) == Decision(policy="edf", reason="deadline misses")


def test_the_reason_is_optional_and_extra_keys_are_ignored():
    assert parse_decision('{"policy": "wfq"}', POOL) == Decision(policy="wfq", reason=None)
    hinted = parse_decision('{"policy": "two_lane", "hints": {"gate": 2}, "bypass": true}', POOL)
    assert hinted == Decision(policy="two_lane")  # the paper's h_t and ξ_bypass are not acted on
    assert parse_decision('{"policy": "sjf", "reason": "' + "x" * 200 + '"}', POOL) is not None


@pytest.mark.parametrize("text", [
    '{"policy": "lottery"}',  # not in the whitelist
    '{"policy": "adaptive"}',  # the meta controller itself
    '{"policy": "EDF"}',  # names match exactly
    "edf",  # not JSON
    "",
    '["edf"]',  # not an object
    '{"policy": ["edf"]}',  # wrong types
    '{"policy": 1}',
    '{"policy": "edf", "reason": 3}',
    '{"reason": "no policy"}',
    '{"policy": "edf", "reason": "' + "x" * 201 + '"}',  # reason too long
    '{"choice": {"policy": "edf"}}',  # the first object that parses is the one read
    '{"policy": "edf"',  # truncated
])
def test_anything_else_is_no_decision(text):
    assert parse_decision(text, POOL) is None


def test_adaptive_is_never_allowed_and_non_text_is_no_decision():
    assert parse_decision('{"policy": "adaptive"}', (*POOL, "adaptive")) is None
    assert parse_decision(None, POOL) is None
    assert parse_decision(b'{"policy": "edf"}', POOL) is None
    assert parse_decision('{"policy": "edf"}', ()) is None


# -- decision_prompt -----------------------------------------------------------------


def test_the_prompt_lists_the_whitelist_and_the_view():
    view = {
        "arrivals": 123, "arrival_rate_per_s": 12.3, "violation_rate": 0.4567, "ttft_p99_s": 8.9,
        "pool": [*POOL, "rr", "mine"], "active": "sjf", "rules": {"policy": "edf", "reason": "deadline misses"},
    }
    prompt = decision_prompt(view)
    assert isinstance(prompt, str) and prompt.strip() and "\x00" not in prompt
    for name in (*POOL, "rr"):
        assert f"- {name}: {DESCRIPTIONS[name]}" in prompt
    assert "- mine: a registered scheduling policy" in prompt
    for number in ("123", "12.3", "0.4567", "8.9"):
        assert number in prompt
    assert "exactly one policy name" in prompt and "only a JSON object" in prompt
    start = prompt.index("{\n")  # the view, as JSON
    assert json.JSONDecoder().raw_decode(prompt, start)[0] == view
    assert "lottery" not in prompt


def test_every_registered_policy_but_adaptive_has_a_description():
    assert set(DESCRIPTIONS) == set(fa.policies.POLICIES) - {"adaptive"}


# -- ModelSelector ---------------------------------------------------------------------


class FakeArbiter:
    """An arbiter's chat method: checks its arguments against the real signature, answers ``text``."""

    def __init__(self, text, delay=0.0):
        self.text, self.delay, self.calls = text, delay, []

    async def chat(self, model, messages, **kwargs):
        inspect.signature(fa.Arbiter.chat).bind(self, model, messages, **kwargs)
        assert set(kwargs) - {"agent", "arrival"} <= set(ChatArgs.__annotations__)
        self.calls.append((model, messages, kwargs))
        await asyncio.sleep(self.delay)
        return fa.Reply(self.text, "stop", model, "req-1", fa.Usage(10, 5, 20.0), fa.Timing(0.0, 0.1, 0.2))


def test_a_model_selector_returns_a_task_with_the_reply_text():
    arbiter = FakeArbiter('{"policy": "edf"}')
    meta = fa.Agent("meta-controller", fa.App("fairagents"))
    view = {"pool": list(POOL), "arrivals": 4242, "violation_rate": 0.125}

    async def main():
        task = ModelSelector(arbiter, "chat", meta, max_tokens=32)(view)
        assert isinstance(task, asyncio.Task) and not task.done()
        return await task

    assert asyncio.run(main()) == '{"policy": "edf"}'
    [(model, messages, kwargs)] = arbiter.calls
    assert model == "chat" and kwargs == {"agent": meta, "max_tokens": 32, "temperature": 0.0}
    assert messages == [{"role": "user", "content": decision_prompt(view)}]
    assert "4242" in messages[0]["content"] and "0.125" in messages[0]["content"]


def test_a_model_selector_drives_the_policy_inside_an_event_loop():
    cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=1)})
    who = fa.Agent("t", fa.App("a"))

    async def main(text, delay=0.0):
        arbiter = FakeArbiter(text, delay)
        selector = ModelSelector(arbiter, "chat", fa.Agent("meta-controller", fa.App("fairagents")))
        policy = Adaptive(cost, initial="fcfs", interval=1.0, selector=selector, selector_timeout=2.0)
        policy.on_arrival(fa.Request("r0", who, "m", 4, 4, 0.5), 0.5)
        policy.on_arrival(fa.Request("r1", who, "m", 4, 4, 1.5), 1.5)  # asks; the task has not run yet
        assert policy.active.name == "fcfs" and len(arbiter.calls) == 0
        for _ in range(3):
            await asyncio.sleep(0)
        policy.on_arrival(fa.Request("r2", who, "m", 4, 4, 1.7), 1.7)
        if delay:
            policy.on_arrival(fa.Request("r3", who, "m", 4, 4, 3.6), 3.6)  # past the deadline
            await asyncio.sleep(0)
        return policy, selector

    policy, _ = asyncio.run(main('```json\n{"policy": "wfq", "reason": "shares"}\n```'))
    assert policy.switches[-1].to == "wfq" and policy.switches[-1].source == "model"
    policy, _ = asyncio.run(main("gibberish from a random-weight model"))
    assert policy.switches[-1].to == "sjf" and policy.switches[-1].source == "fallback: malformed"
    policy, _ = asyncio.run(main('{"policy": "wfq"}', delay=10.0))  # the model takes too long: cancelled
    assert policy.switches[-1].source == "fallback: late" and policy.selector_stats.late == 1


def test_without_a_running_loop_the_model_selector_raises_and_the_policy_falls_back():
    arbiter = FakeArbiter('{"policy": "edf"}')
    selector = ModelSelector(arbiter, "chat", fa.Agent("meta-controller", fa.App("fairagents")))
    with pytest.raises(RuntimeError, match="running event loop"):
        selector({"pool": list(POOL)})
    cost = fa.UnifiedTokenCost({"m": fa.ModelProfile(d_model=4096, n_layers=1)})
    policy = Adaptive(cost, initial="fcfs", interval=1.0, selector=selector)
    who = fa.Agent("t", fa.App("a"))
    policy.on_arrival(fa.Request("r0", who, "m", 4, 4, 0.5), 0.5)
    policy.on_arrival(fa.Request("r1", who, "m", 4, 4, 1.5), 1.5)  # does not raise
    assert [(s.to, s.source) for s in policy.switches] == [("sjf", "fallback: error")]
    assert policy.selector_stats.errors == 1 and not arbiter.calls
