"""A stock OpenAI client naming its app and agent to a `vllm serve` running fairagents' FairScheduler."""

import openai


def main(base_url="http://127.0.0.1:8000/v1", app="search", agent="planner", n=1, max_tokens=32):
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    replies = []
    for _ in range(n):
        reply = client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "Plan a route through the city."}],
            max_tokens=max_tokens,
            extra_body={"vllm_xargs": {"fairagents_app": app, "fairagents_agent": agent}},
        )
        replies.append(reply)
    return replies


if __name__ == "__main__":
    for reply in main():
        print(reply.choices[0].message.content)
