"""A model served by remote vLLM replicas (here the addresses are placeholders: nothing is contacted)."""

import asyncio

import fairagents as fa
from fairagents.engines.remote import OpenAIEngine


async def main():
    engine = OpenAIEngine(
        ["http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1"],  # two `vllm serve` replicas of one model
        model="qwen",  # their --served-model-name
        profile=fa.ModelProfile(d_model=896, n_layers=24),  # or model_path=: its files, for local tokenizing
        max_num_seqs=32,  # per replica: the arbiter's in-flight limit is 64
    )
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", engine)
    # async with arbiter: ... requests go to the least-loaded healthy replica
    print("in flight at most:", arbiter.in_flight_limit("chat"))  # 64
    assert arbiter.in_flight_limit("chat") == 64


if __name__ == "__main__":
    asyncio.run(main())
