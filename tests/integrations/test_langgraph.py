"""fairagents_langgraph: node identity through fair_graph (Send, subgraphs), the chat model, retries, remote mode.

Most tests run on a FakeEngine (a test double); the last ones on the session's real vLLM engine.
"""

import asyncio
import functools
import operator
import threading
from typing import Annotated

import pytest
from fairagents_langgraph import ChatFairAgents, agent_name, fair_graph
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy, Send
from typing_extensions import TypedDict

import fairagents as fa
from fairagents.errors import ProtocolError
from fairagents.testing import FakeEngine

MSG = [HumanMessage("what next?")]


class State(TypedDict, total=False):
    topic: str
    notes: Annotated[list[str], operator.add]


def pool(**engine_kw):
    arbiter = fa.Arbiter(in_flight=8)
    engine = FakeEngine(tokens_per_reply=3, **engine_kw)
    arbiter.add_model("chat", engine)
    return arbiter, engine


def done_by_agent(arbiter, app):
    return {key.split("/", 1)[1]: s.done for key, s in arbiter.stats().agents.items() if key.startswith(f"{app}/")}


# -- identity: one agent per node ------------------------------------------------


async def test_each_node_is_an_agent_charged_with_the_calls_it_made():
    arbiter, _ = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=4)

    async def writer(state):
        await llm.ainvoke(MSG)
        [c async for c in llm.astream(MSG)]
        return {"notes": ["draft"]}

    async def critic(state):
        return {"notes": [(await llm.ainvoke(MSG)).content]}

    def editor(state):  # a sync node: LangGraph runs it in a worker thread
        llm.invoke(MSG)
        list(llm.stream(MSG))
        llm.invoke(MSG)
        return {"notes": ["edited"]}

    builder = StateGraph(State)
    for name, node in (("writer", writer), ("critic", critic), ("editor", editor)):
        builder.add_node(name, node)
    builder.add_edge(START, "writer")
    builder.add_edge("writer", "critic")
    builder.add_edge("critic", "editor")
    studio = arbiter.app("studio")
    async with arbiter:
        await fair_graph(builder.compile(), app=studio).ainvoke({"notes": []})
    assert done_by_agent(arbiter, "studio") == {"writer": 2, "critic": 1, "editor": 3}


async def test_parallel_send_branches_are_one_agent():
    arbiter, engine = pool(token_time=0.002)
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=3)

    def fan_out(state):
        return [Send("searcher", {"topic": f"topic {i}"}) for i in range(5)]

    async def searcher(state):
        return {"notes": [(await llm.ainvoke([HumanMessage(state["topic"])])).content]}

    async def merge(state):
        await llm.ainvoke(MSG)
        return {}

    builder = StateGraph(State)
    builder.add_node("plan", lambda state: {})
    builder.add_node("searcher", searcher)
    builder.add_node("merge", merge)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", fan_out, ["searcher"])
    builder.add_edge("searcher", "merge")
    builder.add_edge("merge", END)
    async with arbiter:
        result = await fair_graph(builder.compile(), app=arbiter.app("research")).ainvoke({"notes": []})
    assert len(result["notes"]) == 5
    assert done_by_agent(arbiter, "research") == {"plan": 0, "searcher": 5, "merge": 1}
    assert engine.max_running >= 2  # the branches did run in parallel


async def test_subgraph_nodes_get_namespaced_agents():
    arbiter, _ = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=2)

    async def drafter(state):
        await llm.ainvoke(MSG)
        await arbiter.chat("chat", [{"role": "user", "content": "raw"}], max_tokens=2)  # no agent given: from context
        return {"notes": ["d"]}

    async def checker(state):
        await llm.ainvoke(MSG)
        return {"notes": ["c"]}

    def subgraph(name, node):
        builder = StateGraph(State)
        builder.add_node(name, node)
        builder.add_edge(START, name)
        return builder.compile()

    team, check = subgraph("drafter", drafter), subgraph("checker", checker)

    async def review(state):  # invokes a subgraph from its body
        await check.ainvoke({"notes": []})
        return {}

    builder = StateGraph(State)
    builder.add_node("team", team)  # a subgraph added as a node
    builder.add_node("review", review)
    builder.add_edge(START, "team")
    builder.add_edge("team", "review")
    async with arbiter:
        await fair_graph(builder.compile(), app=arbiter.app("studio")).ainvoke({"notes": []})
    assert done_by_agent(arbiter, "studio") == {"team/drafter": 2, "review": 0, "review/checker": 1}


async def test_node_metadata_names_and_weighs_the_agent_and_declared_agents_keep_their_settings():
    arbiter, _ = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=2)
    studio = arbiter.app("studio")
    studio.agent("critic", weight=3.0, slo=fa.SLO(ttft=2.0))  # declared beforehand

    async def call(state):
        await llm.ainvoke(MSG)
        return {}

    builder = StateGraph(State)
    builder.add_node("draft", call, metadata={"fairagents_agent": "writer", "fairagents_weight": 2.0})
    builder.add_node("critic", call)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "critic")
    graph = fair_graph(builder.compile(), app=studio)
    async with arbiter:
        await graph.ainvoke({})
        await graph.ainvoke({})  # the second run finds both agents declared
    agents = arbiter.stats().agents
    assert set(done_by_agent(arbiter, "studio")) == {"writer", "critic"}
    assert (agents["studio/writer"].weight, agents["studio/writer"].done) == (2.0, 2)
    assert (agents["studio/critic"].weight, agents["studio/critic"].done) == (3.0, 2)


async def test_the_original_graph_is_untouched_and_runs_as_before():
    arbiter, _ = pool()
    builder = StateGraph(State)
    builder.add_node("who", lambda state: {"notes": [str(fa.current_agent())]})
    builder.add_edge(START, "who")
    graph = builder.compile()
    fair = fair_graph(graph, app=arbiter.app("studio"))
    assert fair is not graph and isinstance(fair, type(graph)) and type(fair).__name__ == type(graph).__name__
    assert (await graph.ainvoke({"notes": []}))["notes"] == ["None"]
    assert "name='who'" in (await fair.ainvoke({"notes": []}))["notes"][0]
    assert fair.config["metadata"]["fairagents_app"] == "studio"
    with pytest.raises(fa.InvalidParameterError):
        fair_graph(builder, app="studio")  # not compiled


def test_agent_name_from_metadata():
    assert agent_name({"langgraph_node": "a", "langgraph_checkpoint_ns": "a:1"}) == "a"
    assert agent_name({"langgraph_node": "c", "langgraph_checkpoint_ns": "a:1|b:2|c:3"}) == "a/b/c"
    assert agent_name({"langgraph_node": "a", "fairagents_agent": "x"}) == "x"
    with pytest.raises(fa.InvalidParameterError):
        agent_name({"fairagents_agent": ""})


# -- the chat model -------------------------------------------------------------------


async def test_chat_model_usage_and_streaming():
    arbiter, engine = pool()
    planner = arbiter.app("driving").agent("planner")
    llm = ChatFairAgents(arbiter=arbiter, model="chat", agent=planner, max_tokens=8)
    prompt = engine.prepare_chat([{"role": "user", "content": "what next?"}]).n_tokens
    async with arbiter:
        message = await llm.ainvoke(MSG)
        chunks = [c async for c in llm.astream(MSG)]
        short = await llm.ainvoke(MSG, max_tokens=2)
    assert message.content == "t0 t1 t2 "
    assert message.usage_metadata == {"input_tokens": prompt, "output_tokens": 3, "total_tokens": prompt + 3}
    assert message.response_metadata["finish_reason"] == "stop"
    assert message.response_metadata["unified_tokens"] == prompt + 2 * 3  # FakeEngine's scale is 1
    assert [c.content for c in chunks] == ["t0 ", "t1 ", "t2 "]
    streamed = functools.reduce(operator.add, chunks)
    assert streamed.content == message.content and streamed.usage_metadata == message.usage_metadata
    assert streamed.response_metadata["unified_tokens"] == prompt + 2 * 3
    assert short.response_metadata["finish_reason"] == "length"
    assert arbiter.stats().agents["driving/planner"].done == 3


async def test_graph_message_stream_carries_the_node():
    arbiter, _ = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat")

    async def writer(state):
        await llm.ainvoke(MSG)
        return {}

    builder = StateGraph(State)
    builder.add_node("writer", writer)
    builder.add_edge(START, "writer")
    async with arbiter:
        tokens = [
            (chunk.content, meta["langgraph_node"])
            async for chunk, meta in fair_graph(builder.compile(), app=arbiter.app("studio")).astream(
                {}, stream_mode="messages"
            )
        ]
    assert [t for t in tokens if t[0]] == [("t0 ", "writer"), ("t1 ", "writer"), ("t2 ", "writer")]


async def test_identity_from_context_outside_a_graph_and_none_at_all():
    arbiter, _ = pool()
    planner = arbiter.app("driving").agent("planner")
    llm = ChatFairAgents(arbiter=arbiter, model="chat")
    async with arbiter:
        with fa.acting_as(planner):
            await llm.ainvoke(MSG)
        with pytest.raises(fa.UnknownAgentError):
            await llm.ainvoke(MSG)
    assert arbiter.stats().agents["driving/planner"].done == 1


async def test_sync_calls_from_other_threads_find_the_arbiters_loop_and_never_block_it():
    arbiter, _ = pool()
    planner = arbiter.app("driving").agent("planner")
    llm = ChatFairAgents(arbiter=arbiter, model="chat", agent=planner)
    async with arbiter:
        with pytest.raises(ProtocolError, match="would block"):
            llm.invoke(MSG)  # on the arbiter's own loop: it would block the loop the call needs
        message = await asyncio.to_thread(llm.invoke, MSG)  # another thread: handed to the arbiter's loop
        chunks = await asyncio.to_thread(lambda: list(llm.stream(MSG)))
    assert message.content == "".join(c.content for c in chunks) == "t0 t1 t2 "
    assert issubclass(ProtocolError, RuntimeError)
    with pytest.warns(DeprecationWarning, match="loop="):
        ChatFairAgents(arbiter=arbiter, loop=asyncio.get_running_loop())


async def test_images_go_to_the_vision_model_or_are_refused():
    arbiter, _ = pool()
    profile = fa.ModelProfile(d_model=4096, n_layers=1, modality=fa.Modality.VISION)
    vision = FakeEngine(tokens_per_reply=2, profile=profile)
    arbiter.add_model("vision", vision)
    agent = arbiter.app("driving").agent("perception")
    image = {"type": "image", "url": "https://example.com/road.png"}
    look = [HumanMessage([{"type": "text", "text": "what is ahead?"}, image])]
    async with arbiter:
        with pytest.raises(fa.InvalidParameterError, match="vision_model"):
            await ChatFairAgents(arbiter=arbiter, model="chat", agent=agent).ainvoke(look)
        reply = await ChatFairAgents(arbiter=arbiter, model="chat", vision_model="vision", agent=agent).ainvoke(look)
        text = await ChatFairAgents(arbiter=arbiter, model="chat", vision_model="vision", agent=agent).ainvoke(MSG)
        with pytest.raises(fa.InvalidParameterError, match="cannot send"):
            audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
            await ChatFairAgents(arbiter=arbiter, model="chat", agent=agent).ainvoke([HumanMessage([audio])])
    assert reply.response_metadata["model_name"] == "vision"
    assert text.response_metadata["model_name"] == "chat"
    assert [r.model for r in arbiter.ledger.records] == ["vision", "chat"]


async def test_bad_parameters_are_typed_value_errors_and_cost_nothing():
    arbiter, _ = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat", agent=arbiter.app("a").agent("t"))
    async with arbiter:
        for call in (
            lambda: llm.ainvoke(MSG, max_tokens=0),
            lambda: llm.ainvoke(MSG, temperature=-1),
            lambda: llm.ainvoke(MSG, frobnicate=True),
            lambda: ChatFairAgents(arbiter=arbiter, model="nope", agent=llm.agent).ainvoke(MSG),
        ):
            with pytest.raises(fa.BadInputError):
                await call()
    assert not arbiter.ledger.charges and not arbiter.ledger.records
    with pytest.raises(ValueError, match="either"):
        ChatFairAgents(arbiter=arbiter, base_url="http://localhost:8000/v1")
    with pytest.raises(ValueError, match="agent handle"):
        ChatFairAgents(arbiter=arbiter, agent="writer")


# -- retries --------------------------------------------------------------------------


async def test_bad_input_in_a_node_is_a_value_error_that_langgraph_does_not_retry():
    arbiter, engine = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat")
    attempts = {"bad": 0, "down": 0}

    def graph(node_name, **call):
        async def node(state):
            attempts[node_name] += 1
            await llm.ainvoke(MSG, **call)
            return {}

        builder = StateGraph(State)
        retry = RetryPolicy(max_attempts=3, initial_interval=0.001, jitter=False)
        builder.add_node(node_name, node, retry_policy=retry)
        builder.add_edge(START, node_name)
        return fair_graph(builder.compile(), app=arbiter.app("studio"))

    async with arbiter:
        with pytest.raises(fa.InvalidParameterError) as info:
            await graph("bad", max_tokens=0).ainvoke({})
        assert isinstance(info.value, ValueError) and attempts["bad"] == 1
        engine.fail()  # an engine fault is not the input's: the default policy retries it
        with pytest.raises(fa.EngineError):
            await graph("down").ainvoke({})
        assert attempts["down"] == 3


# -- a fairagents server (remote) -------------------------------------------------------


async def test_remote_calls_send_the_app_key_and_the_node_as_agent(server):
    llm = ChatFairAgents(
        base_url="http://fair.test/v1",
        api_key="sk-studio",
        model="chat",
        max_tokens=5,
        http_async_client=server.async_client(),
    )

    async def writer(state):
        message = await llm.ainvoke(MSG)
        chunks = [c async for c in llm.astream(MSG)]
        return {"notes": [message, functools.reduce(operator.add, chunks)]}

    builder = StateGraph(State)
    builder.add_node("writer", writer)
    builder.add_edge(START, "writer")
    result = await fair_graph(builder.compile(), app="studio").ainvoke({"notes": []})
    message, streamed = result["notes"]
    for request, body in server.requests:
        assert request.headers["authorization"] == "Bearer sk-studio"
        assert request.headers["x-fairagents-agent"] == "writer"
        assert "x-fairagents-app" not in request.headers  # the key says which app
        assert (body["model"], body["max_tokens"]) == ("chat", 5)
    assert server.body["stream"] and server.body["stream_options"] == {"include_usage": True}
    usage = {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
    assert message.content == streamed.content == "hello"
    assert message.usage_metadata == streamed.usage_metadata == usage
    assert message.response_metadata["unified_tokens"] == streamed.response_metadata["unified_tokens"] == 0.75
    assert streamed.response_metadata["finish_reason"] == "length"


async def test_remote_without_keys_names_the_app_and_sends_no_authorization(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-someone-elses")
    llm = ChatFairAgents(
        base_url="http://fair.test/v1",
        model="chat",
        http_async_client=server.async_client(),
        http_client=server.sync_client(),
    )
    with fa.acting_as(fa.Agent("planner", fa.App("driving"))):
        await llm.ainvoke(MSG)
        await asyncio.to_thread(llm.invoke, MSG)  # the sync client, in a thread (context copied)
        assert "".join(c.content for c in await asyncio.to_thread(lambda: list(llm.stream(MSG)))) == "hello"
    assert len(server.requests) == 3
    for request, _ in server.requests:
        assert "authorization" not in request.headers
        assert (request.headers["x-fairagents-app"], request.headers["x-fairagents-agent"]) == ("driving", "planner")


# -- on the real engine ------------------------------------------------------------------


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="session")
async def test_on_the_real_engine_usage_streaming_and_node_identity(text_engine):
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", text_engine)
    studio = arbiter.app("studio")
    llm = ChatFairAgents(arbiter=arbiter, model="chat", max_tokens=8, ignore_eos=True, seed=1)
    prompt = text_engine.prepare_chat([{"role": "user", "content": "what next?"}]).n_tokens

    async def writer(state):
        message = await llm.ainvoke(MSG)
        chunks = [c async for c in llm.astream(MSG)]
        return {"notes": [message, functools.reduce(operator.add, chunks)]}

    def fan_out(state):
        return [Send("searcher", {"topic": t}) for t in ("roads", "rivers", "rails")]

    async def searcher(state):
        await llm.ainvoke([HumanMessage(state["topic"])], max_tokens=4)
        return {}

    builder = StateGraph(State)
    builder.add_node("writer", writer)
    builder.add_node("searcher", searcher)
    builder.add_edge(START, "writer")
    builder.add_conditional_edges("writer", fan_out, ["searcher"])
    await arbiter.start()
    try:
        result = await fair_graph(builder.compile(), app=studio).ainvoke({"notes": []})
    finally:
        await arbiter.close(stop_engines=False)
    message, streamed = result["notes"]
    usage = {"input_tokens": prompt, "output_tokens": 8, "total_tokens": prompt + 8}
    assert message.usage_metadata == streamed.usage_metadata == usage
    assert message.content == streamed.content and message.content  # same seed, same text
    scale = 128 / 4096 * 2
    assert streamed.response_metadata["unified_tokens"] == pytest.approx(scale * (prompt + 2 * 8))
    assert done_by_agent(arbiter, "studio") == {"writer": 2, "searcher": 3}
    assert arbiter.ledger.service_of("studio", "writer") == pytest.approx(2 * scale * (prompt + 2 * 8))


@pytest.mark.engine
@pytest.mark.asyncio(loop_scope="session")
async def test_on_the_real_engine_token_counting_uses_its_tokenizer_offline(text_engine, monkeypatch):
    from langchain_core.messages import AIMessage, trim_messages

    def refuse():
        raise AssertionError("LangChain's GPT-2 tokenizer was asked for")

    monkeypatch.setattr("langchain_core.language_models.base.get_tokenizer", refuse)
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", text_engine)
    llm = ChatFairAgents(arbiter=arbiter, model="chat")
    history = [HumanMessage("Plan a day trip."), AIMessage("Take the train to Bergen."), HumanMessage("And back?")]
    whole = llm.get_num_tokens_from_messages(history)
    assert whole == text_engine.prepare_chat(
        [{"role": "user", "content": "Plan a day trip."}, {"role": "assistant", "content": "Take the train to Bergen."},
         {"role": "user", "content": "And back?"}]).n_tokens
    assert llm.get_token_ids("Bergen") == list(text_engine.prepare_text("Bergen").token_ids)
    kept = trim_messages(history, max_tokens=whole - 1, token_counter=llm, strategy="last")
    assert kept and llm.get_num_tokens_from_messages(kept) <= whole - 1


def test_a_misspelt_argument_is_an_error_not_ignored():
    with pytest.raises(ValueError, match="max_token"):
        ChatFairAgents(base_url="http://127.0.0.1:1", max_token=5)


def test_token_counting_uses_the_models_own_tokenizer_and_never_downloads_one():
    from langchain_core.messages import AIMessage, trim_messages

    arbiter, engine = pool()
    llm = ChatFairAgents(arbiter=arbiter, model="chat", agent=arbiter.app("a").agent("t"))
    assert llm.get_num_tokens("three little words") == engine.prepare_text("three little words").n_tokens
    history = [HumanMessage("one two three"), AIMessage("four five"), HumanMessage("six")]
    assert llm.get_num_tokens_from_messages(history) == engine.prepare_chat(
        [{"role": "user", "content": "one two three"}, {"role": "assistant", "content": "four five"},
         {"role": "user", "content": "six"}]).n_tokens
    kept = trim_messages(history, max_tokens=5, token_counter=llm, strategy="last")
    assert kept and llm.get_num_tokens_from_messages(kept) <= 5
    remote = ChatFairAgents(base_url="http://127.0.0.1:9/v1", api_key="sk-x", agent="t")
    with pytest.raises(NotImplementedError, match="in process"):
        remote.get_num_tokens("hello")


class TokenizerOnStart(FakeEngine):
    """Like vLLM's engine: its tokenizer is loaded by start(); starts are counted."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.starts = 0

    async def start(self):
        self.starts += 1
        await asyncio.sleep(0.2)
        await super().start()

    def prepare_text(self, text):
        if not self.started:
            raise fa.EngineError("the engine is not started")
        return super().prepare_text(text)

    def prepare_chat(self, messages, tools=None):
        if not self.started:
            raise fa.EngineError("the engine is not started")
        return super().prepare_chat(messages, tools=tools)


def test_token_counting_before_any_call_starts_the_arbiter_as_a_call_would():
    arbiter = fa.Arbiter()
    engine = TokenizerOnStart()
    arbiter.add_model("chat", engine)
    llm = ChatFairAgents(arbiter=arbiter, model="chat", agent=arbiter.app("a").agent("t"))
    try:
        assert llm.get_num_tokens("three little words") == 4  # started through the model's portal
        assert llm.get_num_tokens_from_messages([HumanMessage("two words")]) == 3
        assert llm.invoke("hi", max_tokens=1).content == "t0 "  # the same arbiter, not a second start
        assert engine.starts == 1
    finally:
        llm._backend().portal.close()


def test_first_calls_from_two_threads_share_one_portal_and_one_start():
    arbiter = fa.Arbiter()
    engine = TokenizerOnStart()
    arbiter.add_model("chat", engine)
    llm = ChatFairAgents(arbiter=arbiter, model="chat", agent=arbiter.app("a").agent("t"), max_tokens=1)
    barrier = threading.Barrier(2)
    before = {t for t in threading.enumerate() if t.name == "fairagents-arbiter"}
    replies = []

    def first_call():
        barrier.wait()
        replies.append(llm.invoke("hi").content)

    threads = [threading.Thread(target=first_call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert replies == ["t0 ", "t0 "] and engine.starts == 1
        assert len({t for t in threading.enumerate() if t.name == "fairagents-arbiter"} - before) == 1
    finally:
        llm._backend().portal.close()
