import asyncio
import math

import pytest

import fairagents as fa


@pytest.mark.parametrize("weight", [0, -1, math.inf, math.nan, "2", True, None])
def test_app_weight_must_be_positive_finite_number(weight):
    with pytest.raises(fa.InvalidParameterError):
        fa.App("a", weight=weight)


@pytest.mark.parametrize("weight", [0, -0.5, math.inf])
def test_agent_weight_must_be_positive(weight):
    with pytest.raises(fa.InvalidParameterError):
        fa.Agent("t", fa.App("a"), weight=weight)


@pytest.mark.parametrize("name", ["", "   ", None, 3])
def test_names_must_be_non_empty_strings(name):
    with pytest.raises(fa.InvalidParameterError):
        fa.App(name)
    with pytest.raises(fa.InvalidParameterError):
        fa.Agent(name, fa.App("a"))


def test_agent_needs_an_app_object():
    with pytest.raises(fa.InvalidParameterError):
        fa.Agent("t", "a")


@pytest.mark.parametrize("field", ["ttft", "tpot", "e2e"])
def test_slo_values_must_be_positive(field):
    with pytest.raises(fa.InvalidParameterError):
        fa.SLO(**{field: 0})


def test_slo_met_checks_only_what_is_set():
    slo = fa.SLO(tpot=0.1)
    assert slo.met(ttft=100.0, tpot=0.05, e2e=100.0)
    assert not slo.met(ttft=0.0, tpot=0.2, e2e=0.0)
    assert slo.met(ttft=0.0, tpot=None, e2e=0.0)  # a one-token reply has no tpot


def test_agent_slo_falls_back_to_app():
    app = fa.App("a", slo=fa.SLO(ttft=2.0))
    assert fa.Agent("t", app).effective_slo == fa.SLO(ttft=2.0)
    assert fa.Agent("t", app, slo=fa.SLO(e2e=1.0)).effective_slo == fa.SLO(e2e=1.0)


def test_modality_values():
    assert [m.value for m in fa.Modality] == ["text", "vision", "image"]


def test_acting_as_nests_and_restores():
    outer, inner = fa.Agent("o", fa.App("a")), fa.Agent("i", fa.App("b"))
    with fa.acting_as(outer):
        with fa.acting_as(inner):
            assert fa.current_agent() is inner
        assert fa.current_agent() is outer
    assert fa.current_agent() is None


def test_acting_as_restores_on_error():
    with pytest.raises(RuntimeError), fa.acting_as(fa.Agent("o", fa.App("a"))):
        raise RuntimeError
    assert fa.current_agent() is None


def test_acting_as_rejects_non_agents():
    with pytest.raises(fa.InvalidParameterError), fa.acting_as("planner"):
        pass


def test_decorator_binds_sync_and_async_and_keeps_metadata():
    @fa.agent(app="driving", name="planner", weight=2.0)
    def plan(x):
        """Plan."""
        return fa.current_agent(), x

    @fa.agent(app=fa.App("studio", weight=3.0), name="critic")
    async def critique():
        await asyncio.sleep(0)
        return fa.current_agent()

    who, x = plan(5)
    assert (who.key, who.weight, x) == (("driving", "planner"), 2.0, 5)
    assert plan.__doc__ == "Plan." and plan.__name__ == "plan"
    assert plan.__fairagents_agent__ is who
    critic = asyncio.run(critique())
    assert critic.key == ("studio", "critic") and critic.app.weight == 3.0
    assert fa.current_agent() is None


def test_concurrent_tasks_keep_their_own_identity():
    async def act(name):
        with fa.acting_as(fa.Agent(name, fa.App("a"))):
            await asyncio.sleep(0.01)
            return fa.current_agent().name

    async def main():
        return await asyncio.gather(*(act(f"agent{i}") for i in range(5)))

    assert asyncio.run(main()) == [f"agent{i}" for i in range(5)]


def test_decorator_rejects_generators():
    with pytest.raises(fa.InvalidParameterError, match="generator"):

        @fa.agent(app="a", name="t")
        def gen():
            yield 1

    with pytest.raises(fa.InvalidParameterError, match="generator"):

        @fa.agent(app="a", name="t")
        async def agen():
            yield 1


def test_decorator_validates_eagerly():
    with pytest.raises(fa.InvalidParameterError):
        fa.agent(app="a", name="t", weight=0)


@pytest.mark.parametrize("agent", [
    fa.Agent("t", fa.App("a")),
    fa.Agent("t", fa.App("a", weight=5.0, slo=fa.SLO(e2e=9.0))),  # the app's settings are the server's: not sent
    fa.Agent("t", fa.App("a"), weight=2.5),
    fa.Agent("t", fa.App("a"), slo=fa.SLO(tpot=1e-3)),
    fa.Agent("t", fa.App("a"), weight=1, slo=fa.SLO(ttft=0.25, tpot=0.05, e2e=30)),
])
def test_the_settings_an_agent_states_travel_in_headers_and_are_read_back(agent):
    from fairagents.identity import agent_from_headers, identity_headers

    read = agent_from_headers("a", "t", identity_headers(agent))
    assert read.declared == agent.declared - {"app weight", "app slo"}
    assert read.conflicts(agent) == [] and (read.weight, read.slo) == (agent.weight, agent.slo)
