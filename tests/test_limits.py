"""Bounds on a request's shape: each limit accepts its value and refuses one past it."""

import json

import pytest

import fairagents as fa
from fairagents.limits import DEFAULT_LIMITS, RequestLimits, _regex_shape
from fairagents.testing import FakeEngine
from fairagents.tools import OutputSpec

L = DEFAULT_LIMITS


def obj(properties, required=None):
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required}


def enum(n):
    return obj({"a": {"type": "string", "enum": [f"v{i}" for i in range(n)]}})


def branches(n):
    return obj({"a": {"anyOf": [obj({f"k{i}": {"type": "integer"}}) for i in range(n)]}})


def properties(n):
    return obj({f"k{i}": {"type": "integer"} for i in range(n)})


def optional(n):
    return obj({f"k{i}": {"type": "integer"} for i in range(n)}, required=[])


def nested(levels):
    """Subschemas ``levels`` deep, counting the innermost string."""
    schema = {"type": "string"}
    for _ in range(levels - 1):
        schema = obj({"x": schema})
    return schema


def pattern(p):
    return obj({"a": {"type": "string", "pattern": p}})


def alternation(n):
    """``n`` two-letter words as alternatives (at most 676)."""
    words = [a + b for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz"]
    return "^(" + "|".join(words[:n]) + ")$"


def padded(size):
    """A schema of exactly ``size`` bytes as the constraint measures it (``{"json": ...}`` compact)."""
    base = {"type": "string", "description": ""}
    room = size - len(json.dumps({"json": base}, separators=(",", ":")))
    return {"type": "string", "description": "x" * room}


# name -> (a constraint at the limit, the same one past it, the limit's name)
AT_AND_PAST = {
    "enum": (enum(L.max_enum_values), enum(L.max_enum_values + 1), "max_enum_values"),
    "branches": (branches(L.max_branches), branches(L.max_branches + 1), "max_branches"),
    "properties": (properties(L.max_properties), properties(L.max_properties + 1), "max_properties"),
    "optional": (optional(L.max_optional_properties), optional(L.max_optional_properties + 1),
                 "max_optional_properties"),
    "depth": (nested(L.max_depth), nested(L.max_depth + 1), "max_depth"),
    "pattern length": (pattern("a" * L.max_pattern_chars), pattern("a" * (L.max_pattern_chars + 1)),
                       "max_pattern_chars"),
    "alternatives": (pattern(alternation(L.max_pattern_alternatives)),
                     pattern(alternation(L.max_pattern_alternatives + 1)), "max_pattern_alternatives"),
    "repeat product": (pattern("^(a{1,50}b?){1,50}$"), pattern("^(a{1,50}b?){1,51}$"), "max_repeat_product"),
    "bytes": (padded(L.max_constraint_bytes), padded(L.max_constraint_bytes + 1), "max_constraint_bytes"),
}


@pytest.mark.parametrize("case", sorted(AT_AND_PAST))
def test_a_constraint_at_a_limit_is_accepted_and_one_past_it_refused(case):
    at, past, name = AT_AND_PAST[case]
    L.check_constraint({"json": at}, param="response_format")
    with pytest.raises(fa.InvalidParameterError, match=name) as refused:
        L.check_constraint({"json": past}, param="response_format")
    assert refused.value.param == "response_format"
    assert len(str(refused.value)) < 300  # never the value itself


def test_the_total_pattern_characters_are_bounded():
    four = obj({f"p{i}": {"type": "string", "pattern": "a" * 1000} for i in range(4)})
    L.check_constraint({"json": four}, param="response_format")
    four["properties"]["p4"] = {"type": "string", "pattern": "a"}
    with pytest.raises(fa.InvalidParameterError, match="max_total_pattern_chars"):
        L.check_constraint({"json": four}, param="response_format")


def test_regex_and_choice_constraints_are_bounded_as_schemas_are():
    with pytest.raises(fa.InvalidParameterError, match="max_pattern_alternatives"):
        L.check_constraint({"regex": alternation(300)}, param="structured")
    with pytest.raises(fa.InvalidParameterError, match="max_pattern_chars"):
        L.check_constraint({"regex": "|".join(str(i) for i in range(5_000))}, param="structured")
    with pytest.raises(fa.InvalidParameterError, match="max_repeat_product"):
        L.check_constraint({"regex": "(a{1,50}b?){1,200}"}, param="structured")
    with pytest.raises(fa.InvalidParameterError, match="max_enum_values"):
        L.check_constraint({"choice": [str(i) for i in range(L.max_enum_values + 1)]}, param="structured")
    L.check_constraint({"choice": ["yes", "no"]}, param="structured")


def test_regex_shape_counts_alternatives_and_nested_repeats():
    assert _regex_shape("[a-z]{100000}") == (0, 0)  # one repeat alone is cheap
    assert _regex_shape("(a{2,3}){4}") == (0, 12)
    assert _regex_shape("(a+b){1,5}") == (0, 5)
    assert _regex_shape("a|b|(cd|ef)") == (5, 0)
    assert _regex_shape("\\p{L}+|x")[0] == 2  # a syntax Python lacks: counted by its "|"


@pytest.mark.parametrize(("stop", "bias", "name"), [
    (["s"] * 5, {}, "max_stop"), (["x" * 257], {}, "max_stop_chars"),
    ([], {str(i): 1 for i in range(301)}, "max_logit_bias"),
])
def test_stop_strings_and_logit_bias_past_their_limits_are_refused(stop, bias, name):
    L.check_sampling(stop=["s"] * 4, logit_bias={str(i): 1 for i in range(300)})
    L.check_sampling(stop=["x" * 256], logit_bias=None)
    with pytest.raises(fa.InvalidParameterError, match=name) as refused:
        L.check_sampling(stop=stop, logit_bias=bias)
    assert "x" * 100 not in str(refused.value)


def test_too_many_tools_are_refused():
    tools = [{"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}} for i in range(129)]
    OutputSpec.of(tools=tools[:128], tool_choice="required")
    with pytest.raises(fa.InvalidParameterError, match="max_tools") as refused:
        OutputSpec.of(tools=tools)
    assert refused.value.param == "tools"


def test_limits_can_be_raised_or_lowered():
    assert RequestLimits(max_enum_values=10).max_enum_values == 10
    RequestLimits(max_stop=8).check_sampling(stop=["s"] * 8, logit_bias=None)
    with pytest.raises(fa.InvalidParameterError, match="max_enum_values"):
        OutputSpec.of(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": enum(11)}},
                      limits=RequestLimits(max_enum_values=10))


def test_the_docs_examples_of_tools_and_formats_stay_accepted():
    weather = {"type": "function", "function": {"name": "weather", "parameters": obj({
        "city": {"type": "string", "maxLength": 100}, "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}}, required=["city"])}}
    OutputSpec.of(tools=[weather], tool_choice="required").constraint()
    OutputSpec.of(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": obj({
        "email": {"type": "string", "pattern": "^[^@]+@[^@]+\\.[a-z]{2,}$"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10}})}})


@pytest.mark.asyncio
async def test_the_arbiter_refuses_past_its_limits_before_queueing():
    arbiter = fa.Arbiter(limits=RequestLimits(max_stop=2))
    arbiter.add_model("chat", FakeEngine())
    agent = arbiter.app("a").agent("x")
    async with arbiter:
        msg = [{"role": "user", "content": "hi"}]
        with pytest.raises(fa.InvalidParameterError, match="max_stop") as refused:
            await arbiter.chat("chat", msg, stop=["a", "b", "c"], max_tokens=4, agent=agent)
        assert isinstance(refused.value, ValueError) and refused.value.param == "stop"
        for n, name in ((2_500, "max_enum_values"), (100_000, "max_constraint_bytes")):
            with pytest.raises(fa.InvalidParameterError, match=name):
                await arbiter.chat("chat", msg, max_tokens=4, agent=agent, response_format={
                    "type": "json_schema", "json_schema": {"name": "x", "schema": enum(n)}})
        with pytest.raises(fa.InvalidParameterError, match="max_logit_bias"):
            await arbiter.complete("chat", "hi", max_tokens=4, logit_bias={i: 1 for i in range(301)}, agent=agent)
        assert arbiter.queued("chat") == 0
        assert "a" not in arbiter.stats().apps or arbiter.stats().apps["a"].service == 0
        reply = await arbiter.chat("chat", msg, stop=["a", "b"], max_tokens=4, agent=agent)
        assert reply.usage.completion_tokens > 0


@pytest.mark.asyncio
async def test_the_engines_own_check_runs_in_the_pool_and_is_charged_to_the_app_that_asked():
    import time

    class SlowChecks(FakeEngine):
        def check_params(self, params):
            time.sleep(0.05)  # a grammar to convert, say

    arbiter = fa.Arbiter()
    arbiter.add_model("chat", SlowChecks())
    asker, other = arbiter.app("asker").agent("x"), arbiter.app("other").agent("x")
    async with arbiter:
        await asker.chat("chat", [{"role": "user", "content": "hi"}], max_tokens=2,
                         response_format={"type": "json_object"})
        await other.chat("chat", [{"role": "user", "content": "hi"}], max_tokens=2)  # nothing to check
    assert arbiter.text_preprocessor.used["asker"] >= 0.05
    assert arbiter.text_preprocessor.used.get("other", 0.0) < 0.05
