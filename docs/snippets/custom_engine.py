"""A toy engine that shows the Engine contract end to end (it echoes; it runs no model)."""

import asyncio

import fairagents as fa
from fairagents.engines import Delta, EngineBase, GenerationParams, Prompt


class EchoEngine(EngineBase):
    max_num_seqs = 8  # an optional capability: the arbiter's in-flight limit for it defaults to 8

    def __init__(self, step_time: float = 0.001):
        self.profile = fa.ModelProfile(d_model=512, n_layers=4)
        self.max_model_len = 1024
        self.healthy = True
        self.step_time = step_time
        self._aborted: set[str] = set()

    async def start(self):
        pass

    async def stop(self):
        pass

    def prepare_chat(self, messages):
        return self.prepare_text(" ".join(str(m["content"]) for m in messages))

    def prepare_text(self, text):
        words = text.split()
        if not words:
            raise fa.InvalidParameterError("nothing to echo")
        return Prompt(token_ids=tuple(range(len(words))), data=words)

    async def generate(self, request_id: str, prompt: Prompt, params: GenerationParams):
        words = prompt.data[: params.max_tokens]
        for i, word in enumerate(words):
            await asyncio.sleep(self.step_time)
            if request_id in self._aborted:
                yield Delta(0, "", "abort")
                return
            last = i == len(words) - 1
            yield Delta(1, word + " ", ("length" if len(words) == params.max_tokens else "stop") if last else None)

    async def abort(self, request_id: str):
        self._aborted.add(request_id)


async def main():
    arbiter = fa.Arbiter()
    arbiter.add_model("echo", EchoEngine())
    parrot = arbiter.app("zoo").agent("parrot")
    async with arbiter:
        reply = await parrot.chat("echo", [{"role": "user", "content": "fair share for all"}])
    print(reply.text, reply.usage)  # "fair share for all", 4 prompt + 4 completion tokens
    assert reply.text.split() == ["fair", "share", "for", "all"] and reply.usage.completion_tokens == 4


if __name__ == "__main__":
    asyncio.run(main())
