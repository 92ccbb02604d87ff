from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairagents as fa
from fairagents.policies import HMFS, VTC


def dispatch_next(p, model="m", now=0.0):
    r = p.select(model, now)
    p.on_dispatch(r, now)
    return r


def test_counts_unified_tokens(req, unit_cost):
    p = HMFS(unit_cost)
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    ra, rb = req(a, model="big", prompt=10), req(b, model="m", prompt=10)
    for r in (ra, rb):
        p.on_arrival(r, 0.0)
    for r in (ra, rb):
        p.on_dispatch(r, 0.0)
    assert p.app_counters() == {"a": 40.0, "b": 10.0}  # 'big' is 4x as wide and deep
    p.on_progress(ra, 1, 0.1)
    assert p.app_counters()["a"] == 48.0


def test_app_then_agent_then_earliest_request(req, unit_cost):
    p = HMFS(unit_cost)
    studio, news = fa.App("studio"), fa.App("news")
    writer, critic, reporter = fa.Agent("writer", studio), fa.Agent("critic", studio), fa.Agent("reporter", news)
    w1, w2, c1, n1 = req(writer, id="w1"), req(writer, id="w2"), req(critic, id="c1"), req(reporter, id="n1")
    for r in (w1, w2, c1, n1):
        p.on_arrival(r, 0.0)
    order = [dispatch_next(p).id for _ in range(4)]
    # studio and news alternate (equal app counters); inside studio, writer and critic alternate
    assert order[0] in ("w1", "n1")
    assert set(order[:2]) == {"w1", "n1"} or set(order[:2]) == {"n1", "c1"}
    assert order.index("w1") < order.index("w2")
    assert order[-1] in ("w2", "c1")


def test_hierarchy_shares_apps_equally_however_many_agents(req, unit_cost):
    """An app of three agents gets the same as an app of one; flat VTC over agents gives it 3x."""

    def share(policy):
        big_app, small_app = fa.App("many"), fa.App("one")
        agents = [fa.Agent(f"t{i}", big_app) for i in range(3)] + [fa.Agent("solo", small_app)]
        for _ in range(30):
            for a in agents:
                policy.on_arrival(req(a, prompt=10), 0.0)
        served = defaultdict(int)
        for _ in range(40):
            served[dispatch_next(policy).app] += 1
        return served["many"] / served["one"]

    assert share(HMFS(unit_cost)) == pytest.approx(1.0, abs=0.1)
    assert share(VTC(unit_cost, client="agent")) == pytest.approx(3.0, abs=0.3)


def test_app_and_agent_weights(req, unit_cost):
    p = HMFS(unit_cost)
    gold = fa.App("gold", weight=3.0)
    big, small = fa.Agent("big", gold, weight=2.0), fa.Agent("small", gold)
    plain = fa.Agent("t", fa.App("plain"))
    for _ in range(40):
        for a in (big, small, plain):
            p.on_arrival(req(a, prompt=10), 0.0)
    picks = [dispatch_next(p).agent.key for _ in range(48)]
    by_app = defaultdict(int)
    for app, _ in picks:
        by_app[app] += 1
    assert by_app == {"gold": 36, "plain": 12}
    assert picks.count(("gold", "big")) == 24 and picks.count(("gold", "small")) == 12


def test_lift_on_activation_at_both_levels(req, unit_cost):
    p = HMFS(unit_cost)
    a = fa.App("a")
    x, y = fa.Agent("x", a), fa.Agent("y", a)
    b = fa.Agent("t", fa.App("b"))
    for _ in range(3):
        p.on_arrival(req(x, prompt=50), 0.0)
    p.on_arrival(req(b, prompt=20), 0.0)
    dispatch_next(p)  # x (tie broken by arrival of the app), or b
    dispatch_next(p)
    counters = p.app_counters()
    # y becomes active inside a busy app: lifted to x's counter, not 0
    p.on_arrival(req(y, prompt=5), 1.0)
    assert p.agent_counters("a")["y"] == p.agent_counters("a")["x"] == counters["a"]


def test_lift_to_last_leaver_when_queue_is_empty(req, unit_cost):
    p = HMFS(unit_cost)
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    ra = req(a, prompt=30)
    p.on_arrival(ra, 0.0)
    p.on_dispatch(ra, 0.0)
    p.on_progress(ra, 5, 0.5)  # a keeps being charged after it left the queue
    p.on_arrival(req(b, prompt=1), 1.0)
    assert p.app_counters()["b"] == 40.0


def test_returning_app_keeps_a_higher_counter(req, unit_cost):
    """The lift is a max: an app that was served more than others does not get reset down."""
    p = HMFS(unit_cost)
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    ra = req(a, prompt=100)
    p.on_arrival(ra, 0.0)
    p.on_dispatch(ra, 0.0)
    p.on_finish(ra, fa.Outcome.FINISHED, 0.0)
    p.on_arrival(req(b, prompt=1), 0.0)
    p.on_arrival(req(a, prompt=1), 0.0)
    assert p.app_counters() == {"a": 100.0, "b": 100.0}
    assert dispatch_next(p).app in ("a", "b")


def test_cancelled_waiting_request_costs_nothing(req, unit_cost):
    p = HMFS(unit_cost)
    a = fa.Agent("t", fa.App("a"))
    r = req(a, prompt=100)
    p.on_arrival(r, 0.0)
    p.on_finish(r, fa.Outcome.CANCELLED, 0.1)
    assert p.app_counters() == {"a": 0.0}
    assert p.select("m", 0.2) is None


def test_aborted_running_request_pays_only_what_it_produced(req, unit_cost):
    p = HMFS(unit_cost)
    a = fa.Agent("t", fa.App("a"))
    r = req(a, prompt=10, max_tokens=100)
    p.on_arrival(r, 0.0)
    p.on_dispatch(r, 0.0)
    p.on_progress(r, 4, 0.1)
    p.on_finish(r, fa.Outcome.CANCELLED, 0.2)
    assert p.app_counters() == {"a": 10.0 + 2 * 4}


# -- against a brute-force reference --------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "arrive", "arrive", "dispatch", "dispatch", "progress", "finish", "cancel"]),
        st.integers(0, 5),  # agent index
        st.sampled_from(["m", "big"]),
        st.integers(0, 40),  # tokens
    ),
    max_size=120,
)


class Reference:
    """HMFS written the obvious way: scan everything on every decision."""

    def __init__(self, cost):
        self.cost = cost
        self.capp = defaultdict(float)
        self.cagent = defaultdict(float)
        self.waiting = []
        self.last_app = None
        self.last_agent = {}

    def arrive(self, r):
        app, agent = r.app, r.agent_key
        if not any(w.app == app for w in self.waiting):
            active = {w.app for w in self.waiting}
            floor = min((self.capp[x] for x in active), default=self.capp[self.last_app] if self.last_app else 0.0)
            self.capp[app] = max(self.capp[app], floor)
        if not any(w.agent_key == agent for w in self.waiting):
            active = {w.agent_key for w in self.waiting if w.app == app}
            last = self.last_agent.get(app)
            floor = min((self.cagent[x] for x in active), default=self.cagent[last] if last else 0.0)
            self.cagent[agent] = max(self.cagent[agent], floor)
        self.waiting.append(r)

    def leave(self, r):
        self.waiting.remove(r)
        if not any(w.app == r.app for w in self.waiting):
            self.last_app = r.app
        if not any(w.agent_key == r.agent_key for w in self.waiting):
            self.last_agent[r.app] = r.agent_key

    def charge(self, r, amount):
        self.capp[r.app] += amount / r.agent.app.weight
        self.cagent[r.agent_key] += amount / r.agent.weight


@settings(max_examples=150, deadline=None)
@given(OPS, st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=9, max_size=9))
def test_matches_reference_decisions_and_counters(ops, weights):
    cost = fa.UnifiedTokenCost(
        {"m": fa.ModelProfile(d_model=64, n_layers=1), "big": fa.ModelProfile(d_model=128, n_layers=3)}, d_base=64
    )
    apps = [fa.App(f"a{i}", weight=weights[i]) for i in range(3)]
    agents = [fa.Agent(f"t{i}", apps[i % 3], weight=weights[3 + i]) for i in range(6)]
    p, ref = HMFS(cost), Reference(cost)
    running = []
    n = 0
    for op, who, model, tokens in ops:
        now = float(n)
        n += 1
        if op == "arrive":
            r = fa.Request(f"r{n}", agents[who], model, tokens, 64, now)
            p.on_arrival(r, now)
            ref.arrive(r)
        elif op == "dispatch":
            chosen = p.select(model, now)
            candidates = [w for w in ref.waiting if w.model == model]
            if not candidates:
                assert chosen is None
                continue
            assert chosen is not None and chosen.model == model
            lowest_app = min(ref.capp[w.app] for w in candidates)
            assert ref.capp[chosen.app] == lowest_app
            in_app = [w for w in candidates if w.app == chosen.app]
            assert ref.cagent[chosen.agent_key] == min(ref.cagent[w.agent_key] for w in in_app)
            assert chosen is next(w for w in in_app if w.agent_key == chosen.agent_key)  # its earliest
            p.on_dispatch(chosen, now)
            ref.leave(chosen)
            ref.charge(chosen, cost.input_cost(model, chosen.prompt_tokens))
            running.append(chosen)
        elif op == "progress" and running:
            r = running[who % len(running)]
            p.on_progress(r, tokens, now)
            ref.charge(r, cost.output_cost(r.model, tokens))
        elif op == "finish" and running:
            p.on_finish(running.pop(who % len(running)), fa.Outcome.FINISHED, now)
        elif op == "cancel" and ref.waiting:
            r = ref.waiting[who % len(ref.waiting)]
            p.on_finish(r, fa.Outcome.CANCELLED, now)
            ref.leave(r)
        assert p.queued() == len(ref.waiting)
        for model_name in ("m", "big"):
            assert (p.select(model_name, now) is None) == (not any(w.model == model_name for w in ref.waiting))
        for app in apps:
            assert p.app_counters().get(app.name, 0.0) == pytest.approx(ref.capp[app.name])
            for name, value in p.agent_counters(app.name).items():
                assert value == pytest.approx(ref.cagent[(app.name, name)])


@pytest.mark.parametrize(
    ("make", "order"),
    [
        # unified tokens: a request on 'big' costs 4x one on 'm', so b takes four slots for each of a's;
        # at 40 apiece the tie goes to the earlier arrival
        (lambda cost: HMFS(cost), ["a", "b", "b", "b", "b", "a", "b"]),
        # flat VTC on raw tokens: 10 tokens on 'big' weigh like 10 on 'm', so the apps alternate
        (lambda cost: VTC(), ["a", "b", "a", "b", "b", "b", "b"]),
    ],
    ids=["hmfs", "vtc"],
)
def test_select_among_goes_to_the_lowest_app_across_models(req, unit_cost, make, order):
    p = make(unit_cost)
    a, b = fa.Agent("t", fa.App("a")), fa.Agent("t", fa.App("b"))
    for _ in range(2):
        p.on_arrival(req(a, model="big", prompt=10, arrival=0.0), 0.0)
    for _ in range(5):
        p.on_arrival(req(b, model="m", prompt=10, arrival=0.1), 0.1)
    seen = []
    while (r := p.select_among(["big", "m"], 0.1)) is not None:
        p.on_dispatch(r, 0.1)
        seen.append(r.app)
    assert seen == order


def test_select_among_picks_the_lowest_agent_of_the_app_across_models(req, unit_cost):
    p = HMFS(unit_cost)
    studio = fa.App("studio")
    writer, painter = fa.Agent("writer", studio), fa.Agent("painter", studio)
    for _ in range(2):
        p.on_arrival(req(painter, model="big", arrival=0.0), 0.0)
    for _ in range(5):
        p.on_arrival(req(writer, model="m", arrival=0.1), 0.1)
    order = []
    while (r := p.select_among(["m", "big"], 0.1)) is not None:
        p.on_dispatch(r, 0.1)
        order.append(r.agent.name)
    assert order == ["painter"] + ["writer"] * 4 + ["painter", "writer"]
    assert p.agent_counters("studio") == {"painter": 80.0, "writer": 50.0}


# -- idle credit: a light app back from idle keeps a bounded part of its lag -----------------


def _backlogged_and_light(req, policy, *, light_calls=4):
    """``batch`` is served alone for a while; then ``light``, idle until now, sends a burst."""
    batch, light = fa.Agent("t", fa.App("batch")), fa.Agent("t", fa.App("light"))
    first = req(light, prompt=10)
    policy.on_arrival(first, 0.0)  # light is known, then goes idle: nothing waiting or running
    policy.on_dispatch(first, 0.0)
    policy.on_finish(first, fa.Outcome.FINISHED, 0.0)
    for _ in range(40):
        policy.on_arrival(req(batch, prompt=10), 0.0)
    for _ in range(20):  # batch alone: its counter runs 200 ahead of light's
        done = dispatch_next(policy)
        policy.on_finish(done, fa.Outcome.FINISHED, 0.0)
    for _ in range(light_calls):
        policy.on_arrival(req(light, prompt=10), 1.0)
    return [dispatch_next(policy).app for _ in range(8)]


def test_idle_credit_lets_a_light_apps_burst_run_ahead_as_far_as_the_credit(req, unit_cost):
    # The paper's lift: light comes back at batch's counter, and the two alternate.
    assert _backlogged_and_light(req, HMFS(unit_cost, idle_credit=0)) == ["light", "batch"] * 4
    # A credit of 30, three calls' prompts: three run ahead, then the two alternate.
    credited = HMFS(unit_cost, idle_credit=30)
    assert _backlogged_and_light(req, credited) == ["light"] * 3 + ["batch", "light"] + ["batch"] * 3
    longer = _backlogged_and_light(req, HMFS(unit_cost, idle_credit=30), light_calls=8)
    assert longer == ["light"] * 3 + ["batch", "light"] * 2 + ["batch"]
    policy = HMFS(unit_cost, idle_credit=30)
    _backlogged_and_light(req, policy, light_calls=0)
    policy.on_arrival(req(fa.Agent("t", fa.App("light")), prompt=10), 1.0)
    counters = policy.app_counters()
    assert counters["light"] == counters["batch"] - 30  # never more than the credit behind, however long away


def _running_beside_a_busier_app(p, req, name):
    """``name`` has one call running while ``other`` is served three: the floor is 40, ``name``'s counter 10."""
    running = req(fa.Agent("t", fa.App(name)), prompt=10, id="r")
    p.on_arrival(running, 0.0)
    p.on_dispatch(running, 0.0)
    for _ in range(3):
        p.on_arrival(req(fa.Agent("t", fa.App("other")), prompt=10), 0.0)
    for _ in range(3):
        dispatch_next(p)
    return running


def test_no_credit_for_an_app_whose_calls_are_running(req, unit_cost):
    """Nothing waiting is not idle: an app whose calls run comes back at the floor, as without credit."""
    p = HMFS(unit_cost, idle_credit=1000)
    _running_beside_a_busier_app(p, req, "busy")
    p.on_arrival(req(fa.Agent("t", fa.App("busy")), prompt=10), 1.0)
    assert p.app_counters()["busy"] == p.app_counters()["other"] == 40.0  # lifted to the floor, no credit


def test_a_request_put_back_in_its_engines_queue_earns_no_idle_credit(req, unit_cost):
    """Preempted (ended as cancelled while running, then queued again): its app was not idle, so no credit."""
    p = HMFS(unit_cost, idle_credit=1000)
    running = _running_beside_a_busier_app(p, req, "alone")
    p.on_finish(running, fa.Outcome.CANCELLED, 1.0)  # put back, as the engine's seat does for a preemption
    p.on_arrival(req(fa.Agent("t", fa.App("alone")), prompt=10, id="r"), 1.0)
    assert p.app_counters()["alone"] == p.app_counters()["other"] == 40.0  # the floor, as without credit


def test_idle_credit_weighs_service_not_counters(req, unit_cost):
    """A weight-2 app reclaims the same service as a weight-1 one: half as far in counter units."""
    p = HMFS(unit_cost, idle_credit=40)
    heavy, batch = fa.Agent("t", fa.App("heavy", weight=2.0)), fa.Agent("t", fa.App("batch"))
    first = req(heavy, prompt=10)
    p.on_arrival(first, 0.0)
    p.on_dispatch(first, 0.0)
    p.on_finish(first, fa.Outcome.FINISHED, 0.0)
    r = req(batch, prompt=200)
    p.on_arrival(r, 0.0)
    p.on_dispatch(r, 0.0)
    p.on_arrival(req(batch, prompt=1), 0.0)
    p.on_arrival(req(heavy, prompt=1), 0.0)
    assert p.app_counters()["heavy"] == p.app_counters()["batch"] - 40 / 2.0


def test_idle_credit_follows_U_unless_given(unit_cost):
    paper, fixed = HMFS(unit_cost), HMFS(unit_cost, idle_credit=7)
    follows = fa.policies.make_policy("hmfs_credit", unit_cost)
    assert (paper.idle_credit, follows.idle_credit, fixed.idle_credit) == (0.0, 0.0, 7.0)  # 0 until U is reported
    for policy in (paper, follows, fixed):
        policy.set_bound(500.0)
    assert (paper.idle_credit, follows.idle_credit, fixed.idle_credit) == (0.0, 500.0, 7.0)
    assert HMFS(unit_cost, idle_credit=None).idle_credit == 0.0


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), True, "1"])
def test_idle_credit_refuses_bad_values(unit_cost, bad):
    with pytest.raises(fa.InvalidParameterError, match="idle_credit") as raised:
        HMFS(unit_cost, idle_credit=bad)
    assert isinstance(raised.value, ValueError)


async def test_the_arbiter_reports_U_of_each_device_to_its_policy():
    from fairagents.testing import FakeEngine

    arbiter = fa.Arbiter(policy="hmfs_credit", in_flight=2)
    arbiter.add_model("a", FakeEngine(max_model_len=100), device="one")
    arbiter.add_model("b", FakeEngine(max_model_len=100), device="one")
    arbiter.add_model("c", FakeEngine(max_model_len=300), device="two")
    async with arbiter:
        one, two = arbiter.policy_of("a"), arbiter.policy_of("c")
        assert one is arbiter.policy_of("b") and one is not two
        assert one.idle_credit == arbiter.dispatcher.bound(models=["a", "b"]) > 0
        assert two.idle_credit == arbiter.dispatcher.bound(models=["c"]) != one.idle_credit
