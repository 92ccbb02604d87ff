"""The same workload through the simulator and through the live arbiter (fake engines, fake clock)."""

import fairagents as fa
from fairagents.engines import SimEngine
from fairagents.simulation import Workload, simulate
from fairagents.testing import replay_on_arbiter

model = fa.ModelProfile(d_model=4096, n_layers=4)
flood, victim = fa.Agent("bot", fa.App("flood")), fa.Agent("bot", fa.App("victim"))
work = Workload(seed=1).burst(flood, "chat", n=200, prompt=(40, 80), output=(8, 32))
work.poisson(victim, "chat", rate=20.0, until=5.0, prompt=(40, 80), output=(8, 32))

for run in (simulate, replay_on_arbiter):
    result = run(work, "hmfs", {"chat": SimEngine(model, max_running=4, kv_capacity=512)})
    print(f"{run.__name__}: max gap {result.max_app_gap():.0f}, 2U = {2 * result.bound:.0f}")
    assert result.max_app_gap() <= 2 * result.bound and result.idle_with_backlog == 0
