"""A scenario on the simulator: who gets what under each policy."""

import fairagents as fa
from fairagents.engines import SimEngine
from fairagents.simulation import Workload, simulate

text = fa.ModelProfile(d_model=4096, n_layers=32)
studio, flood = fa.App("studio", weight=2.0), fa.App("flood")
writer, critic = fa.Agent("writer", studio), fa.Agent("critic", studio)
bot = fa.Agent("bot", flood)

work = Workload(seed=0)
work.poisson(writer, "chat", rate=6, until=30, prompt=(200, 600), output=(50, 150))
work.poisson(critic, "chat", rate=6, until=30, prompt=(200, 600), output=(20, 60))
work.poisson(bot, "chat", rate=40, until=30, prompt=(200, 600), output=(50, 150))

for policy in ("fcfs", "vtc", "hmfs"):
    result = simulate(work, policy, {"chat": SimEngine(text, max_running=16, kv_capacity=16_384)})
    shares = {s.name: round(s.share, 2) for s in result.app_stats(until=30)}
    print(policy, shares, f"Jain {result.jain(until=30):.3f}")
    if policy == "hmfs":
        assert shares["studio"] > 0.6  # weight 2 of 3, while both are backlogged
