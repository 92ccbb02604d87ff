"""What the in-engine fair scheduler adds to each vLLM engine step, against vLLM's own scheduler.

vLLM's engine loop calls its scheduler twice per step: ``schedule()`` picks the batch,
``update_from_output()`` takes the model's sampled tokens. This benchmark runs both
without a model, on vLLM's own scheduler and on :class:`~fairagents.vllm.FairScheduler`
(HMFS by default) built from the same engine configuration (the embedded model's,
prefix caching on) and KV cache: ``running`` requests decode in the batch
(``max_num_seqs = running``) and a tenth more wait for a place, so every step the
fair scheduler orders the queue, looks for a fair victim and charges each client's
output. The requests belong to ``clients`` apps, in turn. Each step's sampled tokens
are made up (one token per running request, EOS ignored), so only the schedulers'
own work is timed.

Each cell is the best of ``rounds`` alternating runs of ``steps`` steps per scheduler
(as ``timeit`` does: on a shared machine the slower runs measure the neighbours);
reported: milliseconds per step of each, and the fair scheduler's overhead on top of
vLLM's own, ``fair / vllm − 1``.

Examples:
    >>> from fairagents.bench import scheduler_step
    >>> cell = {"running": 1000, "clients": 10, "vllm_ms": 10.0, "fair_ms": 10.5, "overhead": 0.05}
    >>> scheduler_step.render({"policy": "hmfs", "steps": 20, "rounds": 5, "cells": [cell]}).row_count
    1
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

__all__ = ["render", "run"]

#: Prompt tokens of each request: one KV block.
PROMPT = 16
#: KV block size of the made-up KV cache.
BLOCK = 16


def _schedulers(running: int, clients: int, policy: str) -> tuple[Any, Any]:
    """vLLM's scheduler and a FairScheduler (its own ``policy``), each holding the same requests."""
    import torch
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from fairagents.cost import UnifiedTokenCost
    from fairagents.models import ensure_default_models
    from fairagents.policies import make_policy
    from fairagents.policies.pooled import PoolPolicy
    from fairagents.vllm.queue import Binding
    from fairagents.vllm.scheduler import FairScheduler

    args = EngineArgs(model=str(ensure_default_models(["text"])["text"]), max_model_len=1024, max_num_seqs=running,
                      max_num_batched_tokens=max(2048, running * (PROMPT + 1)), dtype="float32", enforce_eager=True,
                      kv_cache_memory_bytes=2**26)
    config = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    blocks = (running + running // 10 + 1) * 64  # room for every request's prompt and a long decode
    config.cache_config.num_gpu_blocks = blocks
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=16, dtype=torch.float32))])
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(BLOCK, hash_fn)
    cost = UnifiedTokenCost()
    fair_cls = FairScheduler.sharing(Binding(PoolPolicy(make_policy(policy, cost), cost), "engine"))

    def filled(cls: Any) -> Any:
        scheduler = cls(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
                        block_size=BLOCK, log_stats=False)
        for i in range(running + running // 10):
            params = SamplingParams(max_tokens=10**6, ignore_eos=True, extra_args={"fairagents_app": f"app{i % clients}"})
            prompt = [1 + i % 97, *range(2, PROMPT + 1)]  # distinct first blocks: no request is another's prefix
            scheduler.add_request(Request(f"r{i}", prompt, params, None, arrival_time=float(i), block_hasher=hasher))
        return scheduler

    return filled(Scheduler), filled(fair_cls)


def _stepper(scheduler: Any) -> Callable[[], None]:
    from vllm.v1.outputs import ModelRunnerOutput

    def step() -> None:
        output = scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        sampled = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                    sampled_token_ids=[[7] for _ in ids])
        scheduler.update_from_output(output, sampled)

    return step


def _per_step(step: Callable[[], None], steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def run(running: Sequence[int] = (100, 1_000, 4_000), clients: Sequence[int] = (10, 1_000, 10_000), steps: int = 20,
        rounds: int = 5, policy: str = "hmfs") -> dict[str, Any]:
    """Time a step of vLLM's scheduler and of the fair one for each number of running requests and of clients."""
    cells = []
    for n in running:
        for c in clients:
            plain, fair = (_stepper(s) for s in _schedulers(n, c, policy))
            for step in (plain, fair):  # the first steps prefill and fill the batch
                for _ in range(3):
                    step()
            best = {"vllm": float("inf"), "fair": float("inf")}
            for _ in range(rounds):
                best["vllm"] = min(best["vllm"], _per_step(plain, steps))
                best["fair"] = min(best["fair"], _per_step(fair, steps))
            cells.append({"running": n, "clients": c, "vllm_ms": best["vllm"] * 1e3, "fair_ms": best["fair"] * 1e3,
                          "overhead": best["fair"] / best["vllm"] - 1})
    return {"policy": policy, "steps": steps, "rounds": rounds, "cells": cells}


def render(result: dict[str, Any]) -> Table:
    """One table: per running requests and clients, each scheduler's time per step and the overhead."""
    table = Table(title=f"A vLLM engine step's scheduling, vLLM's own vs FairScheduler ({result['policy']}), best of "
                        f"{result['rounds']} × {result['steps']} steps")
    for column in ("running", "clients", "vLLM ms/step", "fair ms/step", "overhead"):
        table.add_column(column, justify="right")
    for cell in result["cells"]:
        table.add_row(f"{cell['running']:,}", f"{cell['clients']:,}", f"{cell['vllm_ms']:.2f}", f"{cell['fair_ms']:.2f}",
                      f"{cell['overhead']:+.0%}")
    return table
