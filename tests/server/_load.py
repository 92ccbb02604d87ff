"""One app as its own process, for the fairness-over-HTTP test: its code is the stock openai client.

Usage: python _load.py URL KEY CONCURRENCY PER_WORKER MAX_TOKENS. It prints "ready", waits for a
line on stdin, sends CONCURRENCY workers' requests (PER_WORKER each, back to back), and prints
JSON with the tokens it received.
"""

import asyncio
import json
import sys

import openai


async def main(url: str, key: str, concurrency: int, per_worker: int, max_tokens: int) -> None:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120) as client:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

        async def worker() -> int:
            tokens = 0
            for _ in range(per_worker):
                reply = await client.chat.completions.create(
                    model="chat",
                    messages=[{"role": "user", "content": "plan a route through the city"}],
                    max_tokens=max_tokens,
                    extra_body={"ignore_eos": True},
                )
                tokens += reply.usage.completion_tokens
            return tokens

        tokens = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
    print(json.dumps({"tokens": tokens}), flush=True)


if __name__ == "__main__":
    url, key, *numbers = sys.argv[1:]
    asyncio.run(main(url, key, *map(int, numbers)))
