"""The coding-agents guide: Anthropic's and the Responses clients against a server, a session per run."""

import asyncio

import agents
import anthropic
import openai
from pydantic import BaseModel

import fairagents as fa
from fairagents.engines.vllm import VLLMEngine
from fairagents.server import Config, create_app, running

CONFIG = Config.model_validate({
    "apps": {"payments": {"api_key": "sk-pay", "weight": 2}, "search": {"api_key": "sk-search"}},
    "server": {"public_views": True, "identity": [
        {"from": "header:x-claude-code-session-id", "to": "run"},
        {"from": "header:x-claude-code-agent-id", "to": "agent", "value": "subagent"},
    ]},
})


class Plan(BaseModel):
    ready: bool  # a bounded answer: the tiny random model completes it in a few tokens


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", VLLMEngine())  # the embedded tiny model
    async with arbiter, running(create_app(arbiter, CONFIG)) as url:
        # Anthropic's Messages API, as Claude Code calls it: the key as x-api-key, its session in a header
        async with anthropic.AsyncAnthropic(base_url=url, api_key="sk-pay",
                                            default_headers={"X-Claude-Code-Session-Id": "5f0c-77"}) as claude:
            message = await claude.messages.create(model="chat", max_tokens=16,
                                                   messages=[{"role": "user", "content": "say hello"}])
        print(message.stop_reason, message.usage.output_tokens, "tokens")

        # OpenAI's Responses API, as the Agents SDK's default model calls it
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-search",
                                      default_headers={"X-Fairagents-Agent": "planner"}) as client:
            planner = agents.Agent(name="planner", instructions="Plan the change.", output_type=Plan,
                                   model=agents.OpenAIResponsesModel(model="chat", openai_client=client),
                                   model_settings=agents.ModelSettings(max_tokens=32))
            result = await agents.Runner.run(planner, "Add a retry to the payment client.",
                                             run_config=agents.RunConfig(tracing_disabled=True))
        print(result.final_output)
    stats = arbiter.stats()
    print(stats.agents["payments/default"].done, stats.agents["search/planner"].done)  # 1 1
    print([r.run for r in arbiter.ledger.records if r.app == "payments"])  # ['5f0c-77']


if __name__ == "__main__":
    asyncio.run(main())
