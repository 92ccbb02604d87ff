"""Every example app runs end to end on the session's real engine (the embedded tiny model).

Each test lends the examples a fresh arbiter over the shared engine, as ``run_all`` lends
one arbiter to all three apps.
"""

import contextlib
import importlib
from pathlib import Path

import pytest

import fairagents as fa

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.engine]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def examples(monkeypatch):
    """Import an example by name, as ``python examples/<name>.py`` would find it and its siblings."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module


@contextlib.asynccontextmanager
async def lent(engine, **kwargs):
    arbiter = fa.Arbiter(**kwargs)
    arbiter.add_model("chat", engine)
    await arbiter.start()
    try:
        yield arbiter
    finally:
        await arbiter.close(stop_engines=False)  # the next test uses the engine too


def done_by_agent(stats, app):
    return {key.removeprefix(f"{app}/"): s.done for key, s in stats.agents.items() if key.startswith(f"{app}/")}


async def test_driving(text_engine, examples, capsys):
    driving = examples("driving")
    async with lent(text_engine) as arbiter:
        log = await driving.main(arbiter)
    assert len(log) == len(driving.FRAMES)
    assert done_by_agent(arbiter.stats(), "driving") == {"planner": 3, "perception": 3, "reporter": 3}
    assert arbiter.stats().apps["driving"].weight == 2.0
    assert capsys.readouterr().out.count("->") == 3


async def test_studio(text_engine, examples, capsys):
    studio = examples("studio")
    async with lent(text_engine) as arbiter:
        story = await studio.main(arbiter)
    assert story["rounds"] == studio.ROUNDS and story["image_prompt"]
    stats = arbiter.stats()
    rounds = studio.ROUNDS
    assert done_by_agent(stats, "studio") == {"writer": rounds, "critic": rounds, "illustrator": 1}
    assert stats.agents["studio/writer"].weight == 2.0
    assert "cover prompt" in capsys.readouterr().out


async def test_research(text_engine, examples):
    research = examples("research")
    async with lent(text_engine) as arbiter:
        result = await research.main(arbiter)
    assert sorted(f.split(":")[0] for f in result["findings"]) == sorted(research.ANGLES)
    angles = len(research.ANGLES)
    assert done_by_agent(arbiter.stats(), "research") == {"planner": 1, "searcher": angles, "writer": 1}


async def test_concierge_calls_tools_and_answers_in_its_schema(text_engine, examples, capsys):
    concierge = examples("concierge")
    async with lent(text_engine) as arbiter:
        result = await concierge.main(arbiter)
    calls = [c for m in result["messages"] for c in getattr(m, "tool_calls", None) or []]
    assert calls and {c["name"] for c in calls} <= {"weather", "route"}  # the first round requires a call
    results = [m for m in result["messages"] if m.type == "tool"]
    assert len(results) == len(calls)  # the tool node ran every call
    assert isinstance(result["trip"], concierge.Trip) and len(result["trip"].steps) <= 3
    agents = done_by_agent(arbiter.stats(), "concierge")
    assert agents["agent"] == result["rounds"] and agents["answer"] == 1
    assert "trip:" in capsys.readouterr().out


async def test_run_all_shares_one_arbiter_and_prints_the_share_table(text_engine, examples, capsys):
    run_all = examples("run_all")
    async with lent(text_engine, in_flight=4) as arbiter:
        stats = await run_all.main(arbiter, repeats=2)
    assert set(stats.apps) == {"driving", "studio", "research", "concierge"}
    assert stats.apps["driving"].weight_share == pytest.approx(0.4)
    assert done_by_agent(stats, "driving")["planner"] == 2 * 3
    assert done_by_agent(stats, "research")["searcher"] == 2 * 4
    assert done_by_agent(stats, "studio")["illustrator"] == 2
    assert sum(s.share for s in stats.apps.values()) == pytest.approx(1.0)
    assert all(s.failed == 0 and s.cancelled == 0 for s in stats.apps.values())
    table = capsys.readouterr().out
    for name in ("driving", "studio", "research", "planner", "searcher", "illustrator", "served"):
        assert name in table
