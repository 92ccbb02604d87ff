"""``fair_graph``: every model call made inside a LangGraph node is charged to an agent named after it.

How a node's identity reaches its model calls. LangGraph runs every node (each
parallel ``Send`` branch is one more task of the same node) with a run config whose
metadata names the task: ``langgraph_node``, and ``langgraph_checkpoint_ns``, which
inside a subgraph is the path of nodes that led there (``"team:<task id>|inner:<task
id>"``); the node's own ``metadata=`` is merged in, and a subgraph inherits the metadata
of the node that runs it. The config travels to everything the node calls: LangChain
keeps it in a context variable that ``ensure_config()`` reads, even in a sync node run
in a worker thread.

:func:`fair_graph` returns a copy of a compiled graph whose nodes each run inside a thin
wrapper (subgraphs added as nodes are copied the same way, recursively). When a node
runs, the wrapper names its agent from that metadata (:func:`agent_name`), declares it on
the app's arbiter if it is new, and binds it with :func:`fairagents.acting_as` while the
node runs: every call the node makes, through :class:`~fairagents_langgraph.ChatFairAgents`,
the OpenAI drop-in or the arbiter itself, is charged to it. ``ChatFairAgents`` names the
agent again from the metadata of its own call, so the nodes of a subgraph that a node
invokes from its body (which no wrapper reaches) still get their namespaced agents.

Each invocation is a run. A top-level ``invoke``, ``ainvoke``, ``stream`` or ``astream``
(``batch`` is several invocations) of the copy opens a run and passes its id down in the
run metadata (``fairagents_run``), which reaches every task, ``Send`` branches and
subgraphs included, in any thread; each node's wrapper binds it with the node's agent,
so every call the node makes belongs to the run. With an app handle the run is the
arbiter's (:meth:`fairagents.Arbiter.run`), which records its end when the invocation
ends; with an app name it is :func:`fairagents.run_scope`'s, and the server learns it
from ``X-Fairagents-Run``. An invocation made inside a run already bound (``with
arbiter.run(...)``, or a graph invoked from another fair graph's node) joins that run;
``config={"metadata": {"fairagents_run": "..."}}`` names the run yourself. The binding
stays inside the graph: code that reads a stream between its chunks is not in the run.

Examples:
    >>> import fairagents as fa
    >>> from langgraph.graph import StateGraph, START
    >>> from typing_extensions import TypedDict
    >>> class State(TypedDict):
    ...     text: str
    >>> builder = StateGraph(State)
    >>> _ = builder.add_node("writer", lambda state: {"text": str(fa.current_agent().key)})
    >>> _ = builder.add_edge(START, "writer")
    >>> studio = fa.Arbiter().app("studio")
    >>> fair_graph(builder.compile(), app=studio).invoke({"text": ""})
    {'text': "('studio', 'writer')"}
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import ensure_config
from langgraph.constants import START
from langgraph.pregel import Pregel

from fairagents import AppHandle, Arbiter
from fairagents.constants import METADATA_AGENT, METADATA_APP, METADATA_RUN, METADATA_WEIGHT
from fairagents.errors import InvalidParameterError
from fairagents.identity import Agent, App, acting_as, check_run, run_scope

__all__ = ["AGENT_SEPARATOR", "agent_name", "current_node_agent", "fair_graph", "node_run"]

G = TypeVar("G", bound=Pregel)

#: Joins the node names of a subgraph path into one agent name: ``"team/inner"``.
AGENT_SEPARATOR = "/"
# How LangGraph spells a checkpoint namespace: tasks joined by "|", each "node:task id".
_NS_SEP, _NS_END = "|", ":"


# The app of the fair_graph run a node is part of: its handle on an in-process arbiter (agents get
# declared on it), or just its name (a server).
_scope: contextvars.ContextVar[AppHandle | App | None] = contextvars.ContextVar(
    "fairagents_langgraph_app", default=None
)


def agent_name(metadata: Mapping[str, Any]) -> str | None:
    """The agent a LangGraph task's run metadata names, or ``None`` outside a graph.

    ``fairagents_agent`` (set in a node's ``metadata=``) wins; otherwise the node's name,
    prefixed by the names of the nodes whose subgraphs it runs in. A ``fairagents_agent``
    on a node that runs a subgraph also names the subgraph's nodes: LangGraph passes a
    node's metadata down.

    Examples:
        >>> agent_name({"langgraph_node": "writer", "langgraph_checkpoint_ns": "writer:1f0c"})
        'writer'
        >>> agent_name({"langgraph_node": "inner", "langgraph_checkpoint_ns": "team:1f0c|inner:9a2b"})
        'team/inner'
        >>> agent_name({"langgraph_node": "plan", "fairagents_agent": "planner"})
        'planner'
        >>> agent_name({}) is None
        True
    """
    override = metadata.get(METADATA_AGENT)
    if override is not None:
        if not isinstance(override, str) or not override.strip():
            raise InvalidParameterError(f"metadata {METADATA_AGENT!r} must be a non-empty string, got {override!r}")
        return override
    namespace = metadata.get("langgraph_checkpoint_ns")
    if isinstance(namespace, str) and namespace:
        return AGENT_SEPARATOR.join(task.split(_NS_END, 1)[0] for task in namespace.split(_NS_SEP))
    node = metadata.get("langgraph_node")
    return node if isinstance(node, str) and node else None


def current_node_agent() -> Agent | None:
    """The agent of the LangGraph node running now under :func:`fair_graph`, declared; else ``None``.

    Reads the run config LangChain keeps in context (the node's, or that of a subgraph's
    node the node invoked).

    Examples:
        >>> current_node_agent() is None
        True
    """
    app = _scope.get()
    if app is None:
        return None
    metadata = ensure_config().get("metadata") or {}
    name = agent_name(metadata)
    return None if name is None else _declare(app, name, metadata.get(METADATA_WEIGHT))


def node_run() -> str | None:
    """The run named in the run config LangChain keeps in context (``fairagents_run``), or ``None``.

    :func:`fair_graph` puts its invocation's run there; code that LangChain runs with the
    config of a node (a tool, a chain) sees it even where the node's binding does not reach.

    Examples:
        >>> node_run() is None
        True
    """
    run = (ensure_config().get("metadata") or {}).get(METADATA_RUN)
    return None if run is None else check_run(run)


def fair_graph(graph: G, app: AppHandle | str) -> G:
    """A copy of a compiled graph whose nodes' model calls are charged to agents named after the nodes.

    Args:
        graph: a compiled graph (``builder.compile()``, or any ``Pregel``).
        app: the app the graph is: its handle on an in-process arbiter
            (``arbiter.app("studio", weight=2.0)``), on which each node's agent is
            declared the first time the node runs (weight 1, or the node's
            ``metadata={"fairagents_weight": ...}``; an agent declared beforehand keeps its
            settings); or the app's name, for a graph whose calls go to a fairagents
            server, which declares each node's agent at its first request (with the node's
            ``fairagents_weight``, sent in ``X-Fairagents-Agent-Weight``).

    Returns:
        A graph of the same type (a subclass of the graph's class whose ``stream`` and
        ``astream``, and so ``invoke`` and ``ainvoke``, make each invocation a run: see the
        module docs); the original is left as it was.

    Raises:
        InvalidParameterError: ``graph`` is not a compiled graph, or ``app`` is neither.

    Examples:
        >>> import fairagents as fa
        >>> from langgraph.graph import StateGraph, START
        >>> from typing_extensions import TypedDict
        >>> class State(TypedDict):
        ...     n: int
        >>> builder = StateGraph(State)
        >>> _ = builder.add_node("count", lambda state: {"n": state["n"] + 1}, metadata={"fairagents_weight": 2.0})
        >>> _ = builder.add_edge(START, "count")
        >>> studio = fa.Arbiter().app("studio")
        >>> fair_graph(builder.compile(), app=studio).invoke({"n": 0})
        {'n': 1}
        >>> studio.agent("count", weight=2.0).identity.weight  # declared by the run
        2.0
    """
    if isinstance(app, AppHandle):
        scope_app: AppHandle | App = app
    elif isinstance(app, str):
        scope_app = App(app)
    else:
        raise InvalidParameterError(f"app must be an arbiter's app handle or an app name, got {app!r}")
    if not isinstance(graph, Pregel):
        raise InvalidParameterError(f"fair_graph takes a compiled graph (builder.compile()), got {graph!r}")
    wrapped = _wrap(graph, scope_app)
    attrs = {k: v for k, v in wrapped.__dict__.items() if k != "__orig_class__"}
    fair = _fair_class(type(graph))(**attrs, fairagents_app=scope_app)
    return fair.with_config(metadata={METADATA_APP: _app_name(scope_app)})


_fair_classes: dict[type, type] = {}


def _fair_class(cls: type[G]) -> type[G]:
    """``cls`` with :class:`_Runs` mixed in (one subclass per graph class)."""
    if issubclass(cls, _Runs):
        return cls
    if cls not in _fair_classes:
        _fair_classes[cls] = type(cls.__name__, (_Runs, cls), {"__module__": cls.__module__})
    return _fair_classes[cls]  # type: ignore[return-value]


class _Runs:
    """Mixed into a fair graph's class: each top-level invocation is a run (see the module docs).

    LangGraph's ``invoke`` and ``ainvoke`` (and ``batch``, the events APIs) iterate ``stream``
    and ``astream``, so these two are where an invocation begins and ends.
    """

    fairagents_app: AppHandle | App

    def __init__(self, *, fairagents_app: AppHandle | App, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fairagents_app = fairagents_app  # in __dict__: copies (with_config, ...) keep it

    def stream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Iterator[Any]:
        run, end = _open_run(self.fairagents_app, config)
        try:
            yield from super().stream(input, _with_run(config, run), **kwargs)  # type: ignore[misc]
        finally:
            end()

    async def astream(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        run, end = _open_run(self.fairagents_app, config)
        try:
            chunks = super().astream(input, _with_run(config, run), **kwargs)  # type: ignore[misc]
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    yield chunk
        finally:
            end()


def _open_run(app: AppHandle | App, config: RunnableConfig | None) -> tuple[str, Callable[[], None]]:
    """Open the run of an invocation (or join the one bound); its id, and what ends it.

    The run is bound in a context of its own, not the caller's: an invocation's stream is
    a generator, and a binding set in one would leak into the code that reads it.
    """
    named = (ensure_config(config).get("metadata") or {}).get(METADATA_RUN)  # given, or a parent graph's
    if named is not None and named == (ensure_config().get("metadata") or {}).get(METADATA_RUN):
        return check_run(named), lambda: None  # run by a node of a graph in that run (as a subgraph): it joins
    arbiter: Arbiter | None = app.arbiter if isinstance(app, AppHandle) else None
    scope = run_scope(named) if arbiter is None else arbiter.run(named)
    context = contextvars.copy_context()
    run = context.run(scope.__enter__)

    def end() -> None:  # the arbiter records the end on its own loop, whichever thread this runs on
        context.run(scope.__exit__, None, None, None)

    return run, end


def _with_run(config: RunnableConfig | None, run: str) -> RunnableConfig:
    config = dict(config or {})
    config["metadata"] = {**(config.get("metadata") or {}), METADATA_RUN: run}
    return config  # type: ignore[return-value]


def _wrap(graph: G, app: AppHandle | App) -> G:
    nodes = {}
    for name, node in graph.nodes.items():
        bound = node.bound
        if name == START or isinstance(bound, _ActingAsNode):
            nodes[name] = node
        elif isinstance(bound, Pregel):  # a subgraph added as a node: its own nodes get the wrapper
            inner = _wrap(bound, app)
            nodes[name] = node.copy({"bound": inner, "subgraphs": [inner]})
        else:  # `subgraphs` stays as LangGraph found it in the original node
            nodes[name] = node.copy({"bound": _ActingAsNode(bound, app)})
    return graph.copy({"nodes": nodes})


class _ActingAsNode(Runnable[Any, Any]):
    """Runs a node's runnable as the agent its run config names."""

    def __init__(self, bound: Runnable[Any, Any], app: AppHandle | App) -> None:
        self.bound = bound
        self.app = app
        self.name = bound.get_name()

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with self._acting(config):
            return self.bound.invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        with self._acting(config):
            return await self.bound.ainvoke(input, config, **kwargs)

    # Streaming falls back to ainvoke (Runnable's default), as it does for LangGraph's own function nodes:
    # binding a context variable across an async generator's yields would leak it into the consumer.

    @contextlib.contextmanager
    def _acting(self, config: RunnableConfig | None) -> Iterator[None]:
        metadata = ensure_config(config).get("metadata") or {}
        name = agent_name(metadata)
        if name is None:  # not run by a graph: nothing to name
            yield
            return
        agent = _declare(self.app, name, metadata.get(METADATA_WEIGHT))
        token = _scope.set(self.app)
        try:
            with acting_as(agent, run=metadata.get(METADATA_RUN)):  # the invocation's run (fair_graph's)
                yield
        finally:
            _scope.reset(token)


def _declare(app: AppHandle | App, name: str, weight: Any) -> Agent:
    if isinstance(app, App):  # calls go to a server, which declares agents from their headers (the weight's too)
        return Agent(name, app) if weight is None else Agent(name, app, weight=weight)
    try:
        return app.agent(name, weight=1.0 if weight is None else weight).identity
    except InvalidParameterError:
        if weight is not None:  # the node's metadata asks for settings the agent was not declared with
            raise
        # Declared beforehand with settings of its own, which it keeps: the arbiter finds it by name
        # (an identity that states none of its settings).
        return Agent(name, App(app.identity.name))


def _app_name(app: AppHandle | App) -> str:
    return app.identity.name if isinstance(app, AppHandle) else app.name
