"""OpenAIEngine's rules on a scripted transport: dispatch, usage, identity, failures (the real replicas: test_remote_vllm)."""

import asyncio
import json

import httpx
import pytest

import fairagents as fa
from fairagents.engines import remote
from fairagents.engines.base import GenerationParams, Prompt
from fairagents.engines.remote import OpenAIEngine

PROFILE = fa.ModelProfile(d_model=4096, n_layers=1)
METRICS = 'vllm:cache_config_info{block_size="128",num_gpu_blocks="33"} 1.0\n'


class Stream(httpx.AsyncByteStream):
    def __init__(self, chunks, fail_after=None, hold=None):
        self.chunks, self.fail_after, self.hold = chunks, fail_after, hold

    async def __aiter__(self):
        for i, chunk in enumerate(self.chunks):
            if self.fail_after is not None and i == self.fail_after:
                raise httpx.ReadError("connection reset by peer")
            if self.hold is not None and i == 1:
                await self.hold.wait()
            yield chunk


def sse(tokens, finish="length", prompt=3):
    out = []
    for i in range(1, tokens + 1):
        choice = {"index": 0, "text": f"t{i} ", "logprobs": None, "finish_reason": finish if i == tokens else None}
        out.append({"id": "c", "object": "text_completion", "created": 0, "model": "chat", "choices": [choice],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": i, "total_tokens": prompt + i}})
    out.append({"id": "c", "object": "text_completion", "created": 0, "model": "chat", "choices": [],
                "usage": {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}})
    return [f"data: {json.dumps(c)}\n\n".encode() for c in out] + [b"data: [DONE]\n\n"]


class Servers:
    """Two scripted replicas, ``a`` and ``b``."""

    def __init__(self):
        self.down, self.bodies, self.fail_after, self.hold, self.status = set(), [], {}, None, {}
        self.health = {"a": 200, "b": 200}
        self.paths = []  # every path asked, in order

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.down:
            raise httpx.ConnectError("connection refused")
        path = request.url.path
        self.paths.append(path)
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "chat", "object": "model", "created": 0, "owned_by": "vllm", "max_model_len": 512}]})
        if path == "/metrics":
            return httpx.Response(200, text=METRICS)
        if path == "/health":
            return httpx.Response(self.health[host])
        if path == "/tokenize":
            body = json.loads(request.content)
            return httpx.Response(200, json={"tokens": list(range(len(json.dumps(body)) % 7 + 2))})
        if path == "/v1/completions":
            body = json.loads(request.content)
            self.bodies.append((host, body))
            if host in self.status:
                return httpx.Response(self.status[host], json={"error": {"message": "nope", "type": "x"}})
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=Stream(sse(body["max_tokens"]), self.fail_after.get(host), self.hold))
        return httpx.Response(404)


def engine(servers, **kwargs):
    return OpenAIEngine(["http://a/v1", "http://b/v1"], model="chat", profile=PROFILE, backoff=0.01,
                        max_backoff=0.05, transport=httpx.MockTransport(servers.handler), **kwargs)


def params(n=4, who=None, run=None):
    return GenerationParams(max_tokens=n, agent=who, run=run)


async def collect(e, rid, n=4, who=None, run=None):
    deltas = [d async for d in e.generate(rid, Prompt(token_ids=(1, 2, 3)), params(n, who, run))]
    return sum(d.new_tokens for d in deltas), "".join(d.text for d in deltas), deltas[-1].finish_reason


async def test_start_learns_context_and_capacity_from_the_replicas():
    e = engine(Servers())
    await e.start()
    assert e.max_model_len == 512
    assert e.token_capacity == 2 * 32 * 128  # two replicas, 33 blocks each less the null block
    await e.stop()


async def test_a_request_streams_the_servers_token_count_and_carries_its_identity():
    servers = Servers()
    e = engine(servers)
    await e.start()
    who = fa.Agent("planner", fa.App("search", weight=2.0))
    tokens, text, finish = await collect(e, "r1", 5, who)
    assert (tokens, finish) == (5, "length") and text.startswith("t1 ")
    host, body = servers.bodies[-1]
    assert body["prompt"] == [1, 2, 3] and body["stream"] and body["stream_options"]["continuous_usage_stats"]
    assert body["vllm_xargs"] == {"fairagents_app": "search", "fairagents_agent": "planner",
                                  "fairagents_app_weight": 2.0, "fairagents_agent_weight": 1.0}
    await collect(e, "r2", 2, who, run="digest-7")  # a request of a run: the replica's scheduler is told it
    assert servers.bodies[-1][1]["vllm_xargs"]["fairagents_run"] == "digest-7"
    await e.stop()


async def test_the_arbiter_passes_a_calls_run_to_a_replica():
    servers = Servers()
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", engine(servers))
    searcher = arbiter.app("search").agent("planner")
    async with arbiter:
        with arbiter.run("digest-7"):
            await searcher.complete("chat", Prompt(token_ids=(1, 2, 3)), max_tokens=2)
        await searcher.complete("chat", Prompt(token_ids=(1, 2, 3)), max_tokens=2)
    runs = [body["vllm_xargs"].get("fairagents_run") for _, body in servers.bodies]
    assert runs == ["digest-7", None]


async def test_requests_go_to_the_least_loaded_replica():
    servers = Servers()
    servers.hold = asyncio.Event()
    e = engine(servers)
    await e.start()
    first = asyncio.create_task(collect(e, "r1"))
    await asyncio.sleep(0.05)  # r1 is open on one replica
    second = asyncio.create_task(collect(e, "r2"))
    await asyncio.sleep(0.05)
    assert sorted(r.running for r in e.replicas) == [1, 1]
    servers.hold.set()
    await asyncio.gather(first, second)
    assert {h for h, _ in servers.bodies} == {"a", "b"}
    await e.stop()


async def test_a_replica_that_fails_before_any_output_hands_the_request_to_another():
    servers = Servers()
    e = engine(servers)
    await e.start()
    servers.down.add("a")
    assert await collect(e, "r1") == (4, "t1 t2 t3 t4 ", "length")
    a, b = e.replicas
    assert not a.healthy and b.healthy and e.healthy and a.failures == 1
    servers.down.discard("a")
    for _ in range(100):  # checked again with backoff, and put back
        if a.healthy:
            break
        await asyncio.sleep(0.01)
    assert a.healthy
    await e.stop()


async def test_a_replica_that_fails_mid_request_fails_it_typed_and_leaves_the_pool_serving():
    servers = Servers()
    servers.fail_after = {"a": 2, "b": 2}
    e = engine(servers)
    await e.start()
    with pytest.raises(fa.EngineError, match="failed mid-request"):
        await collect(e, "r1")
    assert e.healthy  # the other replica still serves
    servers.fail_after = {}
    assert (await collect(e, "r2"))[0] == 4
    await e.stop()


async def test_with_no_replica_left_the_engine_says_it_is_dead():
    servers = Servers()
    e = engine(servers)
    await e.start()
    servers.down |= {"a", "b"}
    servers.health = {"a": 503, "b": 503}
    with pytest.raises(fa.EngineError, match="no replica"):
        await collect(e, "r1")
    assert not e.healthy
    await e.stop()
    servers.down.clear()
    await e.start()  # the arbiter's restart: the replicas answer again
    assert e.healthy
    await e.stop()


async def test_no_replica_at_start_is_an_engine_error():
    servers = Servers()
    servers.down |= {"a", "b"}
    e = engine(servers)
    with pytest.raises(fa.EngineError, match="no replica"):
        await e.start()
    await e.stop()


async def test_abort_closes_the_stream():
    servers = Servers()
    servers.hold = asyncio.Event()
    e = engine(servers)
    await e.start()
    task = asyncio.create_task(collect(e, "r1", 50))
    await asyncio.sleep(0.05)
    await e.abort("r1")
    servers.hold.set()
    tokens, _, finish = await task
    assert finish == "abort" and tokens < 50
    assert all(r.running == 0 for r in e.replicas)
    await e.stop()


async def test_a_request_the_server_refuses_is_bad_input():
    servers = Servers()
    servers.status = {"a": 400, "b": 400}
    e = engine(servers)
    await e.start()
    with pytest.raises(fa.InvalidParameterError, match="rejected the request"):
        await collect(e, "r1")
    assert e.healthy
    await e.stop()


async def test_without_the_models_files_prompts_are_tokenized_by_a_replica():
    e = engine(Servers())
    await e.start()
    prompt = await asyncio.to_thread(e.prepare_chat, [{"role": "user", "content": "hi"}])
    assert prompt.n_tokens >= 2
    with pytest.raises(fa.InvalidParameterError):
        e.prepare_chat([{"role": "user", "content": [{"type": "image_url"}]}])
    await e.stop()


def test_bad_settings_are_refused():
    with pytest.raises(fa.InvalidParameterError, match="urls"):
        OpenAIEngine("http://a/v1", model="chat", profile=PROFILE)
    with pytest.raises(fa.InvalidParameterError, match="urls"):
        OpenAIEngine(["ftp://a"], model="chat", profile=PROFILE)
    assert OpenAIEngine(["http://a/v1", "http://b/v1"], model="chat", profile=PROFILE, max_num_seqs=8).max_num_seqs == 16


async def test_one_bad_request_does_not_empty_the_pool_but_a_failing_replica_goes():
    servers = Servers()
    servers.status = {"a": 500, "b": 500}
    e = engine(servers)
    await e.start()
    with pytest.raises(fa.EngineError, match="answered 500"):
        await collect(e, "r1")
    assert all(r.healthy for r in e.replicas)  # a 500 may be the request's fault: no replica is taken out
    for i in range(6):
        with pytest.raises(fa.EngineError):
            await collect(e, f"r{i + 2}")
    assert not any(r.healthy for r in e.replicas)  # 500s in a row: both are out
    await e.stop()


async def test_a_stream_cut_off_without_a_finish_reason_is_a_failure_not_a_short_reply():
    servers = Servers()
    e = engine(servers)
    await e.start()
    original = servers.handler

    def cut(request):
        response = original(request)
        if request.url.path == "/v1/completions":
            chunks = sse(json.loads(request.content)["max_tokens"])
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Stream(chunks[:2]))
        return response

    servers.handler = cut
    e._transport.handler = cut
    with pytest.raises(fa.EngineError, match="failed mid-request"):
        await collect(e, "r1", 8)
    await e.stop()


async def test_stop_ends_the_health_checks():
    servers = Servers()
    e = engine(servers)
    await e.start()
    servers.down.add("a")
    servers.health["a"] = 503
    await collect(e, "r1")
    a = e.replicas[0]
    assert not a.healthy and a.recheck is not None
    task = a.recheck
    await e.stop()
    assert task.done() and a.recheck is None
    e._take_out(a, RuntimeError("after stop"))
    assert a.recheck is None  # nothing is started once stopped


# -- check_params: what a replica would reject is refused here, before dispatch ----------------------------------

MSG = [{"role": "user", "content": "plan a route"}]
BAD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "bogus"}}}
GOOD_SCHEMA = {"type": "json_schema", "json_schema": {"name": "city", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def check(e, **kwargs):
    e.check_params(GenerationParams(max_tokens=8, **kwargs))


def test_a_logit_bias_outside_the_vocabulary_is_refused_as_vllm_refuses_it():
    e = engine(Servers())
    check(e, logit_bias={10**6: 5.0})  # the vocabulary is not known here: the replica checks
    e.vocab_size = 1000
    check(e, logit_bias={0: -100, 999: 100})
    with pytest.raises(fa.InvalidParameterError, match=r"logit_bias: token_id\(s\) \[1000\] in logit_bias contain "
                                                      r"out-of-vocab token ids. Vocabulary size: 1000"):
        check(e, logit_bias={5: 1.0, 1000: 1.0})


# xgrammar does not support these; guidance (outlines) does: a replica on the auto backend falls back
GUIDANCE_ONLY = ({"json": {"type": "integer", "multipleOf": 3}},
                 {"json": {"type": "object", "patternProperties": {"^a": {"type": "string"}},
                           "properties": {"b": {"type": "string"}}}})


def test_bad_constraints_are_refused_and_good_ones_pass():
    pytest.importorskip("vllm")
    e, auto = engine(Servers()), engine(Servers(), compact_json=False)
    for structured in ({"json": {"type": "object", "properties": {"n": {"type": "integer"}}}}, {"json_object": True},
                       {"regex": "[a-z]+@[a-z]+\\.com"}, {"choice": ["yes", "no"]}, {"grammar": 'root ::= "a" | "b"'}):
        check(e, structured=structured)
        check(auto, structured=structured)
    for structured in GUIDANCE_ONLY:  # what compact replicas (xgrammar alone) refuse, replicas on auto serve
        check(auto, structured=structured)
        with pytest.raises(fa.InvalidParameterError, match="structured outputs, json"):
            check(e, structured=structured)
    for structured, match in (({"json": {"type": "bogus"}}, r"\(structured outputs, json\): .*bogus"),
                              ({"json": {"$ref": "#/$defs/missing"}}, "missing"),
                              ({"regex": "[a-"}, r"(?is)\(structured outputs, regex\): .*unclosed"),
                              ({"regex": "(ab"}, r"(?i)unclosed|not closed"),
                              ({"choice": []}, "cannot be an empty list"),
                              ({"json": {"type": "object"}, "regex": "a"}, "one kind"),
                              ({}, "none given")):
        for replicas in (e, auto):
            with pytest.raises(fa.InvalidParameterError, match=match):
                check(replicas, structured=structured)
    schema = {"type": "object", "properties": {"c": {"type": "string"}}}
    check(e, structured={"json": schema})
    assert schema == {"type": "object", "properties": {"c": {"type": "string"}}}  # left as it was given


def test_other_parameters_vllm_rejects_are_refused():
    pytest.importorskip("vllm")
    e = engine(Servers())
    with pytest.raises(fa.InvalidParameterError, match="temperature must be a number in"):
        check(e, temperature=3.0, logprobs=1)  # vLLM's own bound, which GenerationParams keeps too
    e.vocab_size = 100
    with pytest.raises(fa.InvalidParameterError, match="logprobs of 500"):
        check(e, logprobs=500)


def test_without_vllm_here_only_the_vocabulary_is_checked(monkeypatch):
    monkeypatch.setattr(remote, "_vllm_checks", lambda: None)
    e = engine(Servers())
    check(e, structured={"json": {"type": "bogus"}})  # the replica refuses it, after dispatch
    e.vocab_size = 10
    with pytest.raises(fa.InvalidParameterError, match="out-of-vocab"):
        check(e, logit_bias={10: 1.0})


async def test_a_bad_schema_through_the_arbiter_is_refused_before_dispatch_and_costs_nothing():
    pytest.importorskip("vllm")
    servers = Servers()
    arbiter = fa.Arbiter()
    arbiter.add_model("chat", engine(servers))
    async with arbiter:
        who = arbiter.app("a").agent("t")
        servers.paths.clear()
        with pytest.raises(fa.InvalidParameterError, match="would reject the output constraint"):
            await who.chat("chat", MSG, response_format=BAD_SCHEMA, max_tokens=8)
        with pytest.raises(fa.InvalidParameterError, match="(?i)unclosed|not closed"):
            await who.chat("chat", MSG, tools=[{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"s": {"type": "string", "pattern": "(ab"}}}}}], tool_choice="required",
                max_tokens=8)
        assert servers.paths == []  # neither tokenized nor sent: refused before the queue
        stats = arbiter.stats()
        assert stats.apps == {} or (stats.apps["a"].service == 0 and stats.apps["a"].failed == 0
                                    and stats.apps["a"].done == 0)
        reply = await who.chat("chat", MSG, response_format=GOOD_SCHEMA, max_tokens=3)
    assert reply.usage.completion_tokens == 3
    [(_, body)] = servers.bodies
    assert body["structured_outputs"] == {"json": GOOD_SCHEMA["json_schema"]["schema"]}


async def test_the_model_files_give_the_vocabulary_and_tokenizer_of_the_checks():
    pytest.importorskip("vllm")
    from transformers import AutoConfig

    from fairagents.models import ensure_default_models

    path = ensure_default_models(["text"])["text"]
    e = OpenAIEngine(["http://a/v1"], model="chat", model_path=path, transport=httpx.MockTransport(Servers().handler))
    await e.start()
    vocab = AutoConfig.from_pretrained(path).vocab_size
    assert e._logits_vocab == vocab
    check(e, logit_bias={vocab - 1: 1.0})
    with pytest.raises(fa.InvalidParameterError, match=f"Vocabulary size: {vocab}"):
        check(e, logit_bias={vocab: 1.0})
    e.compact_json = False  # replicas on the auto backend
    check(e, structured={"json": {"type": "integer", "multipleOf": 3}})  # guidance serves this model's tokenizer
    with pytest.raises(fa.InvalidParameterError, match="bogus"):
        check(e, structured={"json": {"type": "bogus"}})
    await e.stop()
