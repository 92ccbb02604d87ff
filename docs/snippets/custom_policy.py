"""A custom policy (earliest deadline first), compared with FCFS on the simulator."""

import heapq

import fairagents as fa
from fairagents.engines import SimEngine
from fairagents.policies import BasePolicy
from fairagents.simulation import Workload, simulate


class EarliestDeadlineFirst(BasePolicy):
    """Requests run in order of arrival + their agent's TTFT objective (10 s without one)."""

    name = "ttft-deadline"

    def __init__(self, default_ttft: float = 10.0):
        super().__init__(fa.RawTokenCost())
        self.default_ttft = default_ttft
        self._heaps: dict[str, list] = {}  # model -> [(deadline, seq, request)]
        self._gone: set[str] = set()  # removed out of order, dropped lazily
        self._seq = 0

    def select(self, model, now):
        heap = self._heaps.get(model, [])
        while heap and heap[0][2].id in self._gone:
            self._gone.discard(heapq.heappop(heap)[2].id)
        return heap[0][2] if heap else None

    def _enqueue(self, req, now):
        slo = req.agent.effective_slo
        ttft = slo.ttft if slo and slo.ttft else self.default_ttft
        self._seq += 1
        heapq.heappush(self._heaps.setdefault(req.model, []), (req.arrival + ttft, self._seq, req))

    def _dequeue(self, req, now, dispatched):
        heap = self._heaps[req.model]
        if heap[0][2] is req:
            heapq.heappop(heap)
        else:
            self._gone.add(req.id)


tight = fa.Agent("pilot", fa.App("driving"), slo=fa.SLO(ttft=0.5))
bulk = fa.Agent("indexer", fa.App("batch"))
work = Workload(seed=1)
work.burst(bulk, "m", n=300, prompt=(100, 300), output=(20, 60))
work.poisson(tight, "m", rate=4.0, until=10.0, prompt=(100, 300), output=(20, 60))


def pilot_attainment(policy):
    engine = SimEngine(fa.ModelProfile(d_model=4096, n_layers=32), max_running=8)
    result = simulate(work, policy, {"m": engine})
    return next(s for s in result.agent_stats() if s.name == "driving/pilot").slo_attainment


print("fcfs", pilot_attainment("fcfs"), "ttft-deadline", pilot_attainment(EarliestDeadlineFirst()))
assert pilot_attainment(EarliestDeadlineFirst()) > 0.9 > pilot_attainment("fcfs")
