"""Who calls: apps by API key, agents by header, declared on the arbiter as requests name them.

:class:`Identities` keeps which key is which app, the agents requests declared (and
undeclares those whose requests were all refused, so a refused request leaves no
state), forgets idle ones from the views, and decides who may read a view.

Examples:
    >>> import fairagents as fa
    >>> from fairagents.server import Config, Gateway
    >>> gateway = Gateway(fa.Arbiter(), Config.model_validate({"apps": {"a": {"api_key": "k", "agents": {"x": {}}}}}))
    >>> gateway.identities.app_for_key("k"), gateway.identities.knows("a", "x"), gateway.identities.knows("a", "y")
    ('a', True, False)
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.exceptions import HTTPException

from fairagents.constants import DEFAULT_AGENT, HEADER_AGENT, HEADER_AGENT_SLO, HEADER_AGENT_WEIGHT, HEADER_APP
from fairagents.errors import InvalidParameterError, ShutdownError, UnknownAgentError, UnknownAppError
from fairagents.identity import Agent, agent_from_headers, run_from_headers
from fairagents.runtime.arbiter import AgentHandle, AppHandle, Arbiter
from fairagents.server.config import DEFAULT_MAX_AGENTS, Config
from fairagents.server.identity_rules import check_name, needs_body, resolve
from fairagents.server.incoming import context, digest, presented_key

if TYPE_CHECKING:
    from fairagents.server.fairness import FairnessView
    from fairagents.server.metrics import Metrics

__all__ = ["DEFAULT_APP", "Identities"]

#: App of a request that names none when keys are off.
DEFAULT_APP = "default"

# The header that states each of an agent's settings a request may state.
_SETTING_HEADERS = {"weight": HEADER_AGENT_WEIGHT, "slo": HEADER_AGENT_SLO}


class Identities:
    """The apps and agents of a server: keys, declarations by requests, idle ones, who reads the views.

    Args:
        arbiter: where apps and agents are declared.
        config: the configured apps (with their keys and agents) and the server's limits.
        view, metrics: the views that show each agent, told when one comes, goes or is refused.
        draining: whether the server admits no new requests.
    """

    def __init__(self, arbiter: Arbiter, config: Config, view: FairnessView, metrics: Metrics,
                 draining: Callable[[], bool]) -> None:
        self.arbiter, self.config, self.view, self.metrics = arbiter, config, view, metrics
        self._draining = draining
        self._keys: dict[bytes, str] = {}
        self._apps: dict[str, AppHandle] = {}
        self._agents: dict[tuple[str, str], AgentHandle] = {}
        observer = config.server.observer_key
        self._observer = None if observer is None else digest(observer.get_secret_value())
        for name, app in config.apps.items():
            own_max_tokens = app.default_max_tokens if isinstance(app.default_max_tokens, int) else None
            handle = arbiter.app(name, app.weight, app.slo.build() if app.slo else None, max_queued=app.max_queued,
                                 max_in_flight_share=app.max_in_flight_share, default_max_tokens=own_max_tokens)
            self._apps[name] = handle
            for agent, settings in app.agents.items():
                self._agents[(name, agent)] = handle.agent(agent, settings.weight,
                                                           settings.slo.build() if settings.slo else None)
            key = app.key()
            if key is not None:
                if digest(key) in self._keys:
                    raise InvalidParameterError(f"apps {self._keys[digest(key)]!r} and {name!r} have the same API key")
                self._keys[digest(key)] = name
        self.rejected: dict[tuple[str, str], int] = defaultdict(int)
        """Requests refused with a full queue, per ``(app, agent)``."""
        self.clock: Callable[[], float] = time.monotonic
        """Seconds, for identities' idle time."""
        self._seen: dict[tuple[str, str], float] = {}  # agents declared by requests: when last seen
        self._agent_count: dict[str, int] = defaultdict(int)
        self._holds: dict[tuple[str, str], int] = {}  # agent -> requests holding it (see release)
        # Agents (and, keys off, apps) declared by requests, none of which queued yet: the samples taken before.
        self._fresh: dict[tuple[str, str], int] = {}
        self._fresh_apps: dict[str, int] = {}
        for app_name, _ in self._agents:
            self._agent_count[app_name] += 1

    def clients(self) -> list[tuple[str, str]]:
        """Every ``(app, agent)`` known now."""
        return list(self._agents)

    def knows(self, app: str, agent: str) -> bool:
        """Whether ``agent`` of ``app`` is declared here now."""
        return (app, agent) in self._agents

    def app_for_key(self, key: str) -> str | None:
        """The app whose API key ``key`` is, or ``None``."""
        return self._keys.get(digest(key))

    async def authenticate(self, request: Request) -> str:
        """The calling app's name (a FastAPI dependency); 401 for a missing or unknown key, 503 while draining.

        The key comes as a bearer key, or as Anthropic's clients send it, ``x-api-key``.
        """
        if self._draining():
            raise ShutdownError("the server is shutting down and admits no new requests")
        if not self.config.server.auth:
            return check_name(request.headers.get(HEADER_APP) or DEFAULT_APP, "app", param=HEADER_APP)
        scheme, _, key = (request.headers.get("authorization") or "").partition(" ")
        key = key.strip() if scheme.lower() == "bearer" else (request.headers.get("x-api-key") or "").strip()
        if not key:
            raise HTTPException(401, "missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
                                {"WWW-Authenticate": "Bearer"})
        app = self.app_for_key(key)
        if app is None:
            raise HTTPException(401, "invalid API key", {"WWW-Authenticate": "Bearer"})
        return app

    async def identify(self, request: Request) -> AgentHandle:
        """The calling agent (a FastAPI dependency): app from :meth:`authenticate`, agent from its header.

        An agent new to its app is declared with the weight and SLO its request states
        (``X-Fairagents-Agent-Weight``, ``X-Fairagents-Agent-Slo``; else weight 1 and the
        app's SLO), as ``app.agent(name, weight, slo)`` declares one in process. Later
        requests may state the same settings, or none; other ones are a 400 naming the
        header, as declaring an agent again with other settings is an error in process.

        The request holds its agent until :meth:`release`: an agent (and, keys off, an
        app) that requests declared is undeclared again when the last request holding it
        ends without ever having queued a request, so a refused request leaves no state.

        The run that ``X-Fairagents-Run`` names is checked here, before anything is
        declared (a bad one is a 400), and kept in the request's context. Without the
        headers, the rules of ``server.identity`` that read headers may name the agent or
        the run (those that read the body apply in :meth:`refine`).
        """
        app = await self.authenticate(request)
        ctx = context(request)
        ctx.run = run_from_headers(request.headers)
        named = request.headers.get(HEADER_AGENT)
        agent, run = resolve(self.config.server.identity, request.headers, in_body=False)
        ctx.run = ctx.run or run
        agent = check_name(named or agent or DEFAULT_AGENT, "agent", param=HEADER_AGENT if named else None)
        return self._hold(request, app, agent)

    async def refine(self, request: Request, who: AgentHandle, body: object) -> AgentHandle:
        """The calling agent once the body is parsed: the rules of ``server.identity`` that read it may name
        another agent, or the run (:mod:`~fairagents.server.identity_rules`).

        ``X-Fairagents-Agent`` and ``X-Fairagents-Run`` still take precedence. The agent :meth:`identify`
        held is released (undeclared again if the request declared it) and the new one held.
        """
        rules = self.config.server.identity
        if not needs_body(rules):
            return who
        ctx = context(request)
        agent, run = resolve(rules, request.headers, body)
        if run is not None and run_from_headers(request.headers) is None:
            ctx.run = run
        if agent is None or request.headers.get(HEADER_AGENT) or agent == who.identity.name:
            return who
        app = who.identity.app.name
        self.release(request)
        return self._hold(request, app, agent)

    def _hold(self, request: Request, app: str, agent: str) -> AgentHandle:
        """Hold ``agent`` of ``app`` for the request, declaring it with the settings its headers state if new."""
        stated = agent_from_headers(app, agent, request.headers)
        key = (app, agent)
        handle = self._agents.get(key)
        if handle is None:
            handle = self._declare(app, agent, stated)
        else:
            conflicts = stated.conflicts(handle.identity)
            if conflicts:
                what, given, declared = conflicts[0]
                raise InvalidParameterError(f"agent {agent!r} of app {app!r} is declared with {what}={declared}; a "
                                            f"request cannot change it (it states {what}={given})", app=app,
                                            agent=agent, param=_SETTING_HEADERS[what])
            if key in self._seen or key in self.view.hidden:
                self._seen[key] = self.clock()
                self.view.recall(app, agent)
        self._holds[key] = self._holds.get(key, 0) + 1
        context(request).holds = key
        return handle

    def release(self, request: Request) -> None:
        """The request's handler ended: undeclare what requests declared if none of them queued a request.

        The last request holding an agent declared by requests undeclares it (everywhere
        it was put) unless the arbiter accounts for it: a request of it waiting, running
        or ended, service charged. Keys off, an app that requests declared goes with its
        last such agent.
        """
        ctx = context(request)
        key, ctx.holds = ctx.holds, None
        if key is None:
            return
        left = self._holds[key] - 1
        if left:
            self._holds[key] = left
            return
        del self._holds[key]
        since = self._fresh.pop(key, None)
        if since is not None:
            if self.arbiter.forget_agent(*key):
                del self._agents[key]
                self._agent_count[key[0]] -= 1
                self._seen.pop(key, None)
                self.rejected.pop(key, None)
                self.metrics.forget(*key)
                self.view.recall(*key)
                self.view.drop(*key, since)
        app = key[0]
        if app in self._fresh_apps:
            if key in self._agents:  # it queued a request: the app stays
                del self._fresh_apps[app]
            elif self._agent_count[app] == 0 and self.arbiter.forget_app(app):
                self.view.drop(app, None, self._fresh_apps.pop(app))
                del self._apps[app], self._agent_count[app]

    def _declare(self, app: str, agent: str, stated: Agent) -> AgentHandle:
        self._check_within_app(stated)
        limit = self.config.apps[app].max_agents if app in self.config.apps else DEFAULT_MAX_AGENTS
        if self._agent_count.get(app, 0) >= limit:
            self.metrics.refuse("max_agents")
            raise UnknownAgentError(f"unknown agent {agent!r}: app {app!r} already has {limit} agents, its max_agents",
                                    app=app, agent=agent)
        handle = self._apps.get(app)
        if handle is None:  # keys off: apps are declared on first use
            if len(self._apps) >= self.config.server.max_apps:
                self.metrics.refuse("max_apps")  # counted without the name: refused names leave no state
                raise UnknownAppError(f"unknown app {app!r}: the server already has {len(self._apps)} apps, its max_apps",
                                      app=app)
            declared = app in self.arbiter.tenants.apps  # by the code that built the arbiter: not the request's
            handle = self._apps[app] = self.arbiter.app(app, max_queued=self.config.server.max_queued)
            if not declared:
                self._fresh_apps[app] = self.view.taken
        declared = (app, agent) in self.arbiter.tenants.agents
        self._agents[(app, agent)] = handle.agent(agent, stated.weight, stated.slo)
        self._agent_count[app] += 1
        if not declared:  # only what a request declared is undone when it ends refused
            self._fresh[(app, agent)] = self.view.taken
        if agent not in (self.config.apps[app].agents if app in self.config.apps else {}):
            self._seen[(app, agent)] = self.clock()
        return self._agents[(app, agent)]

    def forget_idle(self) -> list[tuple[str, str]]:
        """Forget the agents declared by requests (not configured) idle for ``server.identity_idle_seconds``.

        Their series leave ``/metrics``, their samples and ``rejected`` counts
        ``/v1/fairness``; one that comes back is shown again. The arbiter keeps their
        declaration and service (bounded by ``max_apps`` × ``max_agents``), so the
        fair-share counters lose nothing. Returns the agents forgotten.
        """
        idle = self.config.server.identity_idle_seconds
        if idle is None:
            return []
        now = self.clock()
        busy = {t.request.agent_key for t in self.arbiter.dispatcher.tickets()}
        gone = [key for key, seen in self._seen.items() if now - seen >= idle and key not in busy]
        for key in gone:
            del self._seen[key]
            self.rejected.pop(key, None)
            self.metrics.forget(*key)
            self.view.forget(*key)
        return gone

    async def sweep(self) -> None:
        """Forget idle identities every so often (a quarter of the idle time, at most a minute) until cancelled."""
        idle = self.config.server.identity_idle_seconds
        if idle is None:
            return
        while True:
            await asyncio.sleep(min(60.0, idle / 4))
            self.forget_idle()

    def _check_within_app(self, stated: Agent) -> None:
        """Refuse the settings a request states for a new agent where they would weigh against other apps.

        An agent's weight is its share of its app (HMFS charges the app's counter by the app's
        weight alone), unless the policy makes every agent a client of the pool (VTC or WFQ
        with ``client="agent"``). An SLO is a time, not a share: where the order of service
        reads SLOs (``reads_slos`` policies, Statera admission), a tighter one goes ahead of
        other apps' requests. Those settings are then the configuration's to give.
        """
        policy, app, agent = self.arbiter.policy, *stated.key
        if "weight" in stated.declared and getattr(policy, "client", "app") != "app":
            raise InvalidParameterError(
                f"policy {policy.name!r} shares the pool between agents, not apps: an agent's weight is set in the "
                f"server's configuration (apps.{app}.agents.{agent}.weight), not by a request",
                app=app, agent=agent, param=HEADER_AGENT_WEIGHT)
        if "slo" in stated.declared and (getattr(policy, "reads_slos", True) or self.arbiter.admission is not None):
            reader = f"policy {policy.name!r}" if getattr(policy, "reads_slos", True) else "Statera admission"
            raise InvalidParameterError(
                f"{reader} weighs the requests of all apps by their agents' SLOs: an agent's SLO is set in the "
                f"server's configuration (apps.{app}.agents.{agent}.slo), not by a request",
                app=app, agent=agent, param=HEADER_AGENT_SLO)

    async def observe(self, request: Request) -> str | None:
        """Who reads a view (a FastAPI dependency of ``/metrics``, ``/v1/fairness``, ``/dashboard``).

        ``None``: all of it (keys off, ``server.public_views``, or the observer key). An
        app's name: that app's key, which reads its own app's ``/v1/fairness`` (and the
        page that draws it) only. Anyone else is a 401. The key comes as a bearer key, or
        as the password of HTTP Basic (the browser's prompt on ``/dashboard``).
        """
        server = self.config.server
        if not server.auth or server.public_views:
            return None
        key = presented_key(request)
        if key and self._observer is not None and hmac.compare_digest(digest(key), self._observer):
            return None
        app = self.app_for_key(key) if key else None
        if app is not None and request.url.path in ("/v1/fairness", "/dashboard"):
            return app
        challenge = 'Basic realm="fairagents", charset="UTF-8"' if request.url.path == "/dashboard" else "Bearer"
        raise HTTPException(401, "this view needs the observer key", {"WWW-Authenticate": challenge})
