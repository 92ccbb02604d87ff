"""Where the shared fairness state lives: the sync protocol, in memory and in Redis.

Every arbiter (a *door*) calls :meth:`CounterStore.sync` every few milliseconds with a
:data:`Payload` — the charges it made since its last sync, what waits and runs at it
now — and gets a :data:`Reply` back: the pool's counters for its clients and what
waits and runs at the other doors. One sync is one atomic step of the store (its six
steps are listed under :class:`CounterStore`).

:class:`MemoryStore` is the reference (the simulator runs it on a virtual clock);
:class:`RedisStore` runs the same steps as one Lua script (:data:`SYNC_LUA`). A test
checks that both give the same replies to the same payloads. All of a namespace's keys
share one Redis Cluster hash tag (``{fairagents:<namespace>}``), so the script's keys
live on one shard.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["SYNC_LUA", "CounterStore", "MemoryStore", "Payload", "Reply", "StoreUnavailable"]

Payload = dict[str, Any]
"""What a door sends on each sync (JSON-able)::

    {"door": str, "seq": int (grows by one per new payload), "ttl": int (ms),
     "apps": {app: counter delta}, "agents": {app: {agent: counter delta}},
     "raise": {"apps": {app: counter}, "agents": {app: {agent: counter}}}   # only when reconciling
     "waiting": {model: {app: {agent: requests}}}, "running": {model: [requests, reserved tokens]},
     "limits": {model: slots},                                               # models whose slots the doors share
     "want": {app: [agent, ...]}}                                            # the counters to send back

Deltas and counters are in counter units: unified tokens divided by the client's weight.
A payload sent again with a ``seq`` the store has already applied adds its deltas once only.
"""

Reply = dict[str, Any]
"""What a door gets back::

    {"apps": {app: counter}, "agents": {app: {agent: counter}},           # of the clients it wants
     "others": {model: [requests, reserved tokens]},                       # running at the other live doors
     "floor": {"apps": lowest counter of an app active elsewhere, "apps_left": counter of the app that left last,
               "agents": {app: ...}, "agents_left": {app: ...}},          # each key absent when there is none
     "lease": {model: slots},                                             # this door may hold until its next sync
     "turn": {model: bool},   # its lowest-counter app is the lowest waiting anywhere (or none waits elsewhere)
     "doors": live doors}
"""


class StoreUnavailable(ConnectionError):
    """The store cannot be reached now (the door keeps serving on its own counters).

    Examples:
        >>> from fairagents.shared import StoreUnavailable
        >>> try:
        ...     raise StoreUnavailable("redis at redis://db:6379/0 is unreachable")
        ... except ConnectionError as err:   # the door serves on its own counters, and retries
        ...     print(err)
        redis at redis://db:6379/0 is unreachable
    """


@runtime_checkable
class CounterStore(Protocol):
    """Where several arbiters keep one set of fairness counters.

    Contract: :meth:`sync` performs the whole protocol step below atomically, or raises
    :class:`StoreUnavailable` having changed nothing the door cannot resend (a resent
    payload's deltas count once). :meth:`leave` forgets a door's snapshot, so what
    waited there stops counting at once.

    The step:

    1. doors whose snapshot has expired (no sync for ``ttl`` ms: crashed or cut off) are
       forgotten;
    2. the door's counter deltas are added (charges commute: ``HINCRBYFLOAT``); a
       reconciling door then raises each counter to at least its own view (``max``);
    3. the door's snapshot (what waits and runs at it) replaces its last one;
    4. **the lift**: a client that no door had waiting before this step and that waits now
       is raised to ``max(own, min counter over clients active before)``, or to the counter
       of the client that left last when none was active — at both levels (apps; agents
       inside their app). Min and raise happen in one step, so two doors cannot both lift
       against a stale minimum;
    5. the client of a level that stopped waiting everywhere is remembered as the last to
       leave (the highest counter among several);
    6. **leases**: of each model whose slots the doors share, the door may hold what it
       runs plus free slots (those no other door holds by its own lease) for what waits at
       it — as many as it has waiting when its lowest-counter app is the lowest anywhere,
       otherwise only those the other doors' waiting requests leave over — plus its part
       of the slots no waiting request needs (one over the live doors). The door has the
       **turn** when its lowest-counter app is the lowest waiting anywhere (or nothing
       waits elsewhere): until its next sync it may reuse the slots its requests free;
       without the turn it may only start as many requests as it was granted. Leases are
       computed against every other door's lease, so the doors together never hold more
       slots than the model has.

    Examples:
        A store of your own, here one that counts its syncs:

        >>> from fairagents.shared import CounterStore, MemoryStore, SharedCounters
        >>> class Counted(MemoryStore):
        ...     syncs = 0
        ...     async def sync(self, payload):
        ...         self.syncs += 1
        ...         return await super().sync(payload)
        ...     def describe(self):
        ...         return "memory, counted"
        >>> store = Counted()
        >>> isinstance(store, CounterStore), SharedCounters(store, door="a").describe()
        (True, 'memory, counted')
    """

    async def sync(self, payload: Payload) -> Reply:
        """One atomic protocol step for ``payload``'s door."""
        ...

    async def leave(self, door: str) -> None:
        """Forget ``door``'s snapshot (it is closing)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    def describe(self) -> str:
        """Where the state lives, for logs and ``/health`` (no credentials)."""
        ...


class MemoryStore:
    """The reference store: the protocol on Python dicts, in this process.

    For arbiters of one process (tests) and for the simulator, which passes a
    virtual ``clock`` (seconds). Real deployments use :class:`RedisStore`.

    Examples:
        Two arbiters of one process sharing their counters:

        >>> import fairagents as fa
        >>> from fairagents.shared import SharedCounters, MemoryStore
        >>> store = MemoryStore()
        >>> door_a = fa.Arbiter(counters=SharedCounters(store, door="a"))
        >>> door_b = fa.Arbiter(counters=SharedCounters(store, door="b"))
        >>> door_a.counters.door, door_b.counters.store is store
        ('a', True)
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.apps: dict[str, float] = {}
        self.agents: dict[str, dict[str, float]] = {}
        self.doors: dict[str, dict[str, Any]] = {}
        self.left: dict[str, str] = {}  # "" -> the app that left last; app -> its agent that left last

    async def sync(self, payload: Payload) -> Reply:
        return self.apply(payload)

    async def leave(self, door: str) -> None:
        self.doors.pop(door, None)

    async def close(self) -> None:
        return None

    def describe(self) -> str:
        return "memory"

    def apply(self, payload: Payload) -> Reply:
        """The protocol step, synchronously (what :meth:`sync` awaits).

        Examples:
            >>> from fairagents.shared import MemoryStore
            >>> store = MemoryStore(clock=lambda: 0.0)
            >>> reply = store.apply({"door": "a", "seq": 1, "ttl": 1000, "apps": {"x": 5.0}, "agents": {},
            ...                      "waiting": {"chat": {"x": {"bot": 1}}}, "running": {},
            ...                      "want": {"x": ["bot"]}})
            >>> reply["apps"], reply["doors"]
            ({'x': 5.0}, 1)
            >>> other = store.apply({"door": "b", "seq": 1, "ttl": 1000, "apps": {}, "agents": {},
            ...                      "waiting": {"chat": {"y": {"bot": 2}}}, "running": {"chat": [3, 96]},
            ...                      "want": {"y": ["bot"]}})
            >>> other["apps"]["y"]   # y was lifted to x's counter on arrival
            5.0
            >>> other["turn"]        # x (a tie, first by name) goes first, so b has no turn
            {}
        """
        now = int(self.clock() * 1000)
        door = payload["door"]
        apps, agents, doors, left = self.apps, self.agents, self.doors, self.left
        for d in [d for d, snap in doors.items() if snap["expires"] <= now]:
            del doors[d]
        before_apps, before_agents = _active(doors)
        previous = doors.get(door)
        if previous is None or payload["seq"] > previous["seq"]:
            for app, delta in payload["apps"].items():
                apps[app] = apps.get(app, 0.0) + delta
            for app, of_app in payload["agents"].items():
                counters = agents.setdefault(app, {})
                for agent, delta in of_app.items():
                    counters[agent] = counters.get(agent, 0.0) + delta
        raised = payload.get("raise") or {}
        for app, value in (raised.get("apps") or {}).items():
            apps[app] = max(apps.get(app, 0.0), value)
        for app, of_app in (raised.get("agents") or {}).items():
            counters = agents.setdefault(app, {})
            for agent, value in of_app.items():
                counters[agent] = max(counters.get(agent, 0.0), value)
        seq = payload["seq"] if previous is None else max(previous["seq"], payload["seq"])
        doors[door] = {"seq": seq, "expires": now + payload["ttl"], "waiting": payload["waiting"],
                       "running": payload["running"], "lease": {}}
        after_apps, after_agents = _active(doors)
        # The lift, against the clients active before this step.
        for app in after_apps - before_apps:
            floor = _floor(apps, before_apps, left.get(""))
            apps[app] = max(apps.get(app, 0.0), floor)
        for app, now_active in after_agents.items():
            was = before_agents.get(app, set())
            counters = agents.setdefault(app, {})
            for agent in now_active - was:
                counters[agent] = max(counters.get(agent, 0.0), _floor(counters, was, left.get(app)))
        gone = before_apps - after_apps
        if gone:
            left[""] = max(gone, key=lambda a: (apps.get(a, 0.0), a))
        for app, was in before_agents.items():
            gone = was - after_agents.get(app, set())
            if gone:
                counters = agents.get(app, {})
                left[app] = max(gone, key=lambda a: (counters.get(a, 0.0), a))
        lease, turn = self._leases(door, payload)
        doors[door]["lease"] = lease
        return self._reply(door, payload, lease, turn)

    def _leases(self, door: str, payload: Payload) -> tuple[dict[str, int], dict[str, bool]]:
        """The slots of each shared model this door may hold until its next sync.

        The door keeps what it runs, and takes free slots (those no other door holds
        by its own lease) for what waits at it: as many as it has waiting when its
        lowest-counter app is the lowest anywhere, else only those the other doors'
        waiting requests leave over. Of the slots no waiting request needs, it takes its
        part (one over the live doors), so a request arriving at an idle door runs at
        once instead of at the next sync.
        """
        apps = self.apps
        lease: dict[str, int] = {}
        turn: dict[str, bool] = {}
        for model, slots in (payload.get("limits") or {}).items():
            mine = payload["running"].get(model, (0, 0))[0]
            held = their_wait = 0
            theirs: list[tuple[float, str]] = []
            for d, snap in self.doors.items():
                if d == door:
                    continue
                running = snap["running"].get(model, (0, 0))[0]
                held += max(running, snap["lease"].get(model, running))
                for app, of_app in snap["waiting"].get(model, {}).items():
                    theirs.append((apps.get(app, 0.0), app))
                    their_wait += sum(of_app.values())
            of_model = payload["waiting"].get(model, {})
            my_wait = sum(sum(of_app.values()) for of_app in of_model.values())
            free = slots - held - mine
            mine_first = not theirs or bool(my_wait) and min((apps.get(a, 0.0), a) for a in of_model) <= min(theirs)
            grant = 0
            if my_wait and free > 0:
                grant = min(free if mine_first else max(0, free - their_wait), my_wait)
            spare = free - grant - their_wait  # wanted by no request waiting anywhere: split among the doors
            if spare > 0:
                grant += spare // len(self.doors)
            lease[model] = mine + grant
            turn[model] = mine_first
        return lease, turn

    def _reply(self, door: str, payload: Payload, lease: dict[str, int], turn: dict[str, bool]) -> Reply:
        apps, agents, left = self.apps, self.agents, self.left
        want: dict[str, list[str]] = payload["want"]
        others: dict[str, list[int]] = {}
        active_apps: set[str] = set()
        active_agents: dict[str, set[str]] = {}
        for d, snap in self.doors.items():
            if d == door:
                continue
            for model, (n, tokens) in snap["running"].items():
                o = others.setdefault(model, [0, 0])
                o[0] += n
                o[1] += tokens
            for of_model in snap["waiting"].values():
                for app, of_app in of_model.items():
                    active_apps.add(app)
                    active_agents.setdefault(app, set()).update(of_app)
        floor: dict[str, Any] = {}
        if active_apps:
            floor["apps"] = min(apps.get(a, 0.0) for a in active_apps)
        if "" in left:
            floor["apps_left"] = apps.get(left[""], 0.0)
        agent_floor = {app: min(agents.get(app, {}).get(a, 0.0) for a in names)
                       for app, names in active_agents.items() if app in want}
        if agent_floor:
            floor["agents"] = agent_floor
        agent_left = {app: agents.get(app, {}).get(left[app], 0.0) for app in want if app in left}
        if agent_left:
            floor["agents_left"] = agent_left
        return {
            "apps": {app: apps.get(app, 0.0) for app in want},
            "agents": {app: {a: agents.get(app, {}).get(a, 0.0) for a in names} for app, names in want.items()},
            "others": others,
            "floor": floor,
            "lease": lease,
            "turn": turn,
            "doors": len(self.doors),
        }


def _active(doors: dict[str, dict[str, Any]]) -> tuple[set[str], dict[str, set[str]]]:
    apps: set[str] = set()
    agents: dict[str, set[str]] = {}
    for snap in doors.values():
        for of_model in snap["waiting"].values():
            for app, of_app in of_model.items():
                apps.add(app)
                agents.setdefault(app, set()).update(of_app)
    return apps, agents


def _floor(counters: dict[str, float], active: set[str], last_left: str | None) -> float:
    if active:
        return min(counters.get(c, 0.0) for c in active)
    if last_left is not None:
        return counters.get(last_left, 0.0)
    return 0.0


def encode(payload: Payload) -> str:
    """A payload as the Lua script reads it (compact JSON)."""
    return json.dumps(payload, separators=(",", ":"))


#: The protocol step as one Redis script (KEYS: apps, agents, doors, left; ARGV: the payload as JSON).
#: It mirrors :meth:`MemoryStore.apply` line for line; agents' counters live in one hash under
#: ``app NUL agent`` fields.
SYNC_LUA = r"""
local K_APPS, K_AGENTS, K_DOORS, K_LEFT = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local p = cjson.decode(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local door = p['door']
local SEP = '\0'

local function num(v) if v then return tonumber(v) end return 0.0 end
local function app_c(a) return num(redis.call('HGET', K_APPS, a)) end
local function agent_c(a, g) return num(redis.call('HGET', K_AGENTS, a .. SEP .. g)) end
local function set_max(key, field, value)
  local cur = num(redis.call('HGET', key, field))
  if value > cur then redis.call('HSET', key, field, string.format('%.17g', value)) end
end

-- doors: live snapshots, decoded once
local doors = {}
local raw = redis.call('HGETALL', K_DOORS)
for i = 1, #raw, 2 do
  local snap = cjson.decode(raw[i + 1])
  if snap['expires'] <= now then redis.call('HDEL', K_DOORS, raw[i]) else doors[raw[i]] = snap end
end
local function active()
  local apps, agents = {}, {}
  for _, snap in pairs(doors) do
    for _, of_model in pairs(snap['waiting']) do
      for a, of_app in pairs(of_model) do
        apps[a] = true
        agents[a] = agents[a] or {}
        for g, _ in pairs(of_app) do agents[a][g] = true end
      end
    end
  end
  return apps, agents
end
local before_apps, before_agents = active()

local previous = doors[door]
if previous == nil or p['seq'] > previous['seq'] then
  for a, d in pairs(p['apps']) do redis.call('HINCRBYFLOAT', K_APPS, a, d) end
  for a, of_app in pairs(p['agents']) do
    for g, d in pairs(of_app) do redis.call('HINCRBYFLOAT', K_AGENTS, a .. SEP .. g, d) end
  end
end
local raised = p['raise']
if raised then
  for a, v in pairs(raised['apps'] or {}) do set_max(K_APPS, a, v) end
  for a, of_app in pairs(raised['agents'] or {}) do
    for g, v in pairs(of_app) do set_max(K_AGENTS, a .. SEP .. g, v) end
  end
end
local seq = p['seq']
if previous ~= nil and previous['seq'] > seq then seq = previous['seq'] end
local snap = {seq = seq, expires = now + p['ttl'], waiting = p['waiting'], running = p['running'], lease = {}}
doors[door] = snap
local after_apps, after_agents = active()

-- the lift, against the clients active before this step
local function floor_of(get, active_set, last)
  local low = nil
  for c, _ in pairs(active_set) do
    local v = get(c)
    if low == nil or v < low then low = v end
  end
  if low ~= nil then return low end
  if last then return get(last) end
  return 0.0
end
local left_app = redis.call('HGET', K_LEFT, '')
for a, _ in pairs(after_apps) do
  if not before_apps[a] then set_max(K_APPS, a, floor_of(app_c, before_apps, left_app)) end
end
for a, now_active in pairs(after_agents) do
  local was = before_agents[a] or {}
  local last = redis.call('HGET', K_LEFT, a)
  local get = function(g) return agent_c(a, g) end
  for g, _ in pairs(now_active) do
    if not was[g] then set_max(K_AGENTS, a .. SEP .. g, floor_of(get, was, last)) end
  end
end
local function last_of(gone, get)
  local best, best_v = nil, nil
  for c, _ in pairs(gone) do
    local v = get(c)
    if best == nil or v > best_v or (v == best_v and c > best) then best, best_v = c, v end
  end
  return best
end
local gone = {}
for a, _ in pairs(before_apps) do if not after_apps[a] then gone[a] = true end end
local g_app = last_of(gone, app_c)
if g_app then redis.call('HSET', K_LEFT, '', g_app) end
for a, was in pairs(before_agents) do
  local gone_agents = {}
  local still = after_agents[a] or {}
  for g, _ in pairs(was) do if not still[g] then gone_agents[g] = true end end
  local last = last_of(gone_agents, function(g) return agent_c(a, g) end)
  if last then redis.call('HSET', K_LEFT, a, last) end
end

-- leases of the shared models' slots
local function less(c1, n1, c2, n2) if c1 ~= c2 then return c1 < c2 end return n1 <= n2 end
local lease, turn = {}, {}
for model, slots in pairs(p['limits'] or {}) do
  local r = p['running'][model]
  local mine = r and r[1] or 0
  local held, their_wait, best_c, best_n = 0, 0, nil, nil
  for d, s in pairs(doors) do
    if d ~= door then
      local rr = s['running'][model]
      local running = rr and rr[1] or 0
      local l = (s['lease'] or {})[model] or running
      held = held + math.max(running, l)
      for a, of_app in pairs(s['waiting'][model] or {}) do
        local c = app_c(a)
        if best_c == nil or less(c, a, best_c, best_n) then best_c, best_n = c, a end
        for _, n in pairs(of_app) do their_wait = their_wait + n end
      end
    end
  end
  local my_wait, my_c, my_n = 0, nil, nil
  for a, of_app in pairs(p['waiting'][model] or {}) do
    local c = app_c(a)
    if my_c == nil or less(c, a, my_c, my_n) then my_c, my_n = c, a end
    for _, n in pairs(of_app) do my_wait = my_wait + n end
  end
  local free = slots - held - mine
  local mine_first = best_c == nil or (my_wait > 0 and less(my_c, my_n, best_c, best_n))
  local grant = 0
  if my_wait > 0 and free > 0 then
    if mine_first then grant = math.min(free, my_wait)
    else grant = math.min(math.max(0, free - their_wait), my_wait) end
  end
  local spare = free - grant - their_wait
  if spare > 0 then
    local n = 0
    for _, _ in pairs(doors) do n = n + 1 end
    grant = grant + math.floor(spare / n)
  end
  lease[model] = mine + grant
  turn[model] = mine_first
end
snap['lease'] = lease
redis.call('HSET', K_DOORS, door, cjson.encode(snap))

-- the reply
local want = p['want']
local others, active_apps, active_agents = {}, {}, {}
local n_doors = 0
for d, s in pairs(doors) do
  n_doors = n_doors + 1
  if d ~= door then
    for model, r in pairs(s['running']) do
      local o = others[model] or {0, 0}
      o[1] = o[1] + r[1]
      o[2] = o[2] + r[2]
      others[model] = o
    end
    for _, of_model in pairs(s['waiting']) do
      for a, of_app in pairs(of_model) do
        active_apps[a] = true
        active_agents[a] = active_agents[a] or {}
        for g, _ in pairs(of_app) do active_agents[a][g] = true end
      end
    end
  end
end
local floor = {}
local low = nil
for a, _ in pairs(active_apps) do
  local v = app_c(a)
  if low == nil or v < low then low = v end
end
if low ~= nil then floor['apps'] = low end
left_app = redis.call('HGET', K_LEFT, '')
if left_app then floor['apps_left'] = app_c(left_app) end
local agent_floor, agent_left, any_floor, any_left = {}, {}, false, false
for a, _ in pairs(want) do
  if active_agents[a] then
    local lo = nil
    for g, _ in pairs(active_agents[a]) do
      local v = agent_c(a, g)
      if lo == nil or v < lo then lo = v end
    end
    agent_floor[a] = lo
    any_floor = true
  end
  local last = redis.call('HGET', K_LEFT, a)
  if last then
    agent_left[a] = agent_c(a, last)
    any_left = true
  end
end
if any_floor then floor['agents'] = agent_floor end
if any_left then floor['agents_left'] = agent_left end
local r_apps, r_agents = {}, {}
for a, names in pairs(want) do
  r_apps[a] = app_c(a)
  local of_app = {}
  for _, g in ipairs(names) do of_app[g] = agent_c(a, g) end
  r_agents[a] = of_app
end
return cjson.encode({apps = r_apps, agents = r_agents, others = others, floor = floor, lease = lease, turn = turn,
                     doors = n_doors})
"""
