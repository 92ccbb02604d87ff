"""The served OpenAPI document: what it declares, and a live server fuzzed against it with schemathesis.

The document's own tests need no server. The server is the real one (uvicorn on
loopback, in a thread with its own event loop, as schemathesis calls it synchronously)
on FakeEngines: a text model and an image model. Request bodies on either side of the
line are checked to be accepted by the schema exactly when the server accepts them;
then valid and invalid requests to every endpoint are generated from the served
document. The answers a fuzzer rarely provokes (401, 413, 429, 503, readiness 503) are
driven on purpose and checked against the same document.
"""

import asyncio
import concurrent.futures
import contextlib
import json
import threading
import time

import jsonschema
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

import fairagents as fa
from fairagents.engines.base import Delta, Prompt
from fairagents.server import Config, create_app
from fairagents.protocols import anthropic, responses
from fairagents.server.wire import HARMLESS
from fairagents.testing import FakeEngine

from ._support import KEYS, MSG, FakePainter, live, make_config

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
AUTH = {"Authorization": f"Bearer {KEYS['driving']}"}
POSTS = {"/v1/chat/completions": "ChatCompletionRequest", "/v1/completions": "CompletionRequest",
         "/v1/images/generations": "ImageGenerationRequest", "/v1/messages": "MessagesRequest",
         "/v1/messages/count_tokens": "CountTokensRequest", "/v1/responses": "ResponsesRequest"}
HARMLESS_OF = {"MessagesRequest": anthropic.HARMLESS, "CountTokensRequest": anthropic.HARMLESS,
               "ResponsesRequest": responses.HARMLESS}
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")
OPERATIONS = [("POST", path) for path in POSTS] + [
    ("GET", path) for path in ("/v1/models", "/v1/models/{model}", "/v1/fairness", "/metrics", "/health",
                               "/health/live", "/dashboard")]
# Examples per operation, valid and invalid: a few hundred requests in all; the `fast` profile scales it down.
EXAMPLES = min(60, settings.default.max_examples)


def pool(in_flight=4, **chat):
    arbiter = fa.Arbiter(in_flight=in_flight, drain_timeout=1.0)
    arbiter.add_model("chat", FakeEngine(**{"tokens_per_reply": 4, **chat}))
    arbiter.add_model("painter", FakePainter())
    return arbiter


@contextlib.contextmanager
def serving(arbiter, config):
    """Serve ``arbiter`` in a thread with its own event loop; yields (base URL, gateway, loop)."""
    loop = asyncio.new_event_loop()
    started = concurrent.futures.Future()
    stop = asyncio.Event()

    async def main():
        try:
            async with live(arbiter, config) as (url, gateway):
                started.set_result((url, gateway))
                await stop.wait()
        except BaseException as err:
            if not started.done():
                started.set_exception(err)
            raise

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        url, gateway = started.result(timeout=30)
        yield url, gateway, loop
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def in_loop(loop, function):
    """Run ``function()`` in the server's event loop and return its result."""
    async def call():
        return function()
    return asyncio.run_coroutine_threadsafe(call(), loop).result(10)


@pytest.fixture(scope="module")
def server():
    """One live server for the module: the text model ``chat`` and the image model ``painter``."""
    with serving(pool(), make_config()) as (url, _, _):
        yield url


@pytest.fixture(scope="module")
def api_schema(server):
    """The document as the server serves it, loaded by schemathesis."""
    return schemathesis.openapi.from_url(f"{server}/openapi.json")


# -- the document ------------------------------------------------------------------------


def document(config=None):
    return create_app(pool(), config or make_config()).openapi()


def test_every_post_route_takes_a_required_json_body_of_its_request_model():
    doc = document()
    schemas = doc["components"]["schemas"]
    for path, model in POSTS.items():
        body = doc["paths"][path]["post"]["requestBody"]
        assert body["required"] is True and list(body["content"]) == ["application/json"]
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
        schema = schemas[model]
        assert "$defs" not in schema and set(HARMLESS_OF.get(model, HARMLESS)) <= set(schema["properties"])
        assert schema["additionalProperties"]["enum"] == [None, False, 0, [], {}]
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["n"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 128}
    assert chat["messages"]["items"] == {"$ref": "#/components/schemas/ChatMessage"}
    assert {"tools", "tool_choice", "parallel_tool_calls", "response_format", "logprobs", "top_logprobs",
            "presence_penalty", "frequency_penalty", "logit_bias"} <= set(chat)
    assert {"ChatMessage", "MessageToolCall", "StreamOptions", "ImagesUsage"} <= set(schemas)
    assert "Examples:" not in str(doc) and "HTTPValidationError" not in schemas


def test_every_v1_route_declares_its_errors_and_the_bearer_key():
    paths = document()["paths"]
    assert set(paths) == {*POSTS, "/v1/models", "/v1/models/{model}", "/v1/fairness", "/metrics", "/health",
                          "/health/live", "/dashboard"}
    for path in POSTS:
        post = paths[path]["post"]
        counting = {"429"} if path == "/v1/messages/count_tokens" else set()  # counting queues nothing
        assert set(post["responses"]) == {"200", "400", "401", "404", "413", "429", "503"} - counting
        assert post["security"] == ([{"bearer": []}, {"apiKey": []}] if path in ANTHROPIC else [{"bearer": []}])
        assert [p["name"] for p in post["parameters"]] == ["X-Fairagents-Agent", "X-Fairagents-Agent-Weight",
                                                           "X-Fairagents-Agent-Slo", "X-Fairagents-Run"]
        agent = jsonschema.Draft202012Validator(post["parameters"][0]["schema"])
        assert agent.is_valid("planner") and not agent.is_valid("_other")  # the overflow label of /metrics
    models = paths["/v1/models"]["get"]  # with keys on, nothing of a listing request can be a 400 or a 429
    assert set(models["responses"]) == {"200", "401", "503"} and models["security"] == [{"bearer": []}]
    one = paths["/v1/models/{model}"]["get"]
    assert set(one["responses"]) == {"200", "401", "404", "503"} and one["security"] == [{"bearer": []}]
    for path, operations in paths.items():
        for operation in operations.values():
            assert "422" not in operation["responses"]  # a bad parameter is a 400 here
            for status, response in operation["responses"].items():
                if int(status) >= 400 and path != "/health":
                    shape = "AnthropicError" if path in ANTHROPIC else "ErrorResponse"
                    assert response["content"] == {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape}"}}}
    responses = paths["/v1/chat/completions"]["post"]["responses"]
    assert set(responses["200"]["content"]) == {"application/json", "text/event-stream"}
    assert responses["401"]["headers"]["WWW-Authenticate"]["required"] is True
    assert all(responses["429"]["headers"][name]["required"] for name in ("Retry-After", "retry-after-ms"))
    assert set(paths["/v1/fairness"]["get"]["responses"]) == {"200", "400"}  # open without an observer key


def test_health_declares_503_and_the_open_routes_take_no_key():
    doc = document()
    bearer = doc["components"]["securitySchemes"]["bearer"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    health = doc["paths"]["/health"]["get"]["responses"]
    assert set(health) == {"200", "503"}
    for path in ("/health", "/health/live", "/dashboard", "/metrics", "/v1/fairness"):  # no observer key configured
        assert "security" not in doc["paths"][path]["get"] and "401" not in doc["paths"][path]["get"]["responses"]


def test_the_document_follows_the_configuration():
    guarded = document(make_config(observer_key="sk-observer"))["paths"]
    for path in ("/v1/fairness", "/metrics"):
        assert guarded[path]["get"]["security"] == [{"bearer": []}] and "401" in guarded[path]["get"]["responses"]
    open_ = document(Config.model_validate({"server": {"auth": False}}))["paths"]
    for path in (*POSTS, "/v1/models"):
        (operation,) = open_[path].values()
        assert "security" not in operation and "401" not in operation["responses"] and "400" in operation["responses"]
        assert "X-Fairagents-App" in [p["name"] for p in operation["parameters"]]


CHAT = {"model": "chat", "messages": MSG}
WEATHER = {"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
AGREEMENT = [  # (schema, body, whether valid): where the schema can tell, it says what the server accepts
    ("ChatCompletionRequest", CHAT, True),
    ("ChatCompletionRequest", {**CHAT, "temperature": 1, "top_p": 0.5, "seed": -1, "stop": ["\n"], "n": 1}, True),
    ("ChatCompletionRequest", {**CHAT, "user": "u-1", "metadata": {"k": "v"}, "tools": [], "logprobs": False}, True),
    ("ChatCompletionRequest", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, True),
    ("ChatCompletionRequest", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}, True),
    ("ChatCompletionRequest", {**CHAT, "n": 2, "presence_penalty": 1.5, "frequency_penalty": -0.5,
                               "logit_bias": {"3": 100, "7": -100}, "logprobs": True, "top_logprobs": 2}, True),
    ("ChatCompletionRequest", {**CHAT, "tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": False}, True),
    ("ChatCompletionRequest", {**CHAT, "tools": [WEATHER], "tool_choice": {"type": "function",
                                                                           "function": {"name": "weather"}}}, True),
    ("ChatCompletionRequest", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "city", "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}}}, True),
    ("ChatCompletionRequest", {**CHAT, "response_format": {"type": "text"}}, True),
    ("ChatCompletionRequest", {**CHAT, "messages": [*MSG, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"}], "tools": [WEATHER]}, True),
    ("ChatCompletionRequest", {**CHAT, "temperature": False}, False),
    ("ChatCompletionRequest", {**CHAT, "max_tokens": "8"}, False),
    ("ChatCompletionRequest", {**CHAT, "n": 0}, False),
    ("ChatCompletionRequest", {**CHAT, "n": 129}, False),
    ("ChatCompletionRequest", {**CHAT, "logit_bias": {"3": 101}}, False),
    ("ChatCompletionRequest", {**CHAT, "logit_bias": {"x": 1}}, False),
    ("ChatCompletionRequest", {**CHAT, "presence_penalty": 2.5}, False),
    ("ChatCompletionRequest", {**CHAT, "top_logprobs": 2}, False),
    ("ChatCompletionRequest", {**CHAT, "logprobs": True, "top_logprobs": 21}, False),
    ("ChatCompletionRequest", {**CHAT, "tool_choice": "any", "tools": [WEATHER]}, False),
    ("ChatCompletionRequest", {**CHAT, "tools": [{**WEATHER, "function": {"name": "has space"}}]}, False),
    ("ChatCompletionRequest", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, False),
    ("ChatCompletionRequest", {**CHAT, "messages": [*MSG, {"role": "user", "content": "x", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]}]}, False),
    ("ChatCompletionRequest", {**CHAT, "seed": 2**64}, False),
    ("ChatCompletionRequest", {**CHAT, "stop": ""}, False),
    ("ChatCompletionRequest", {**CHAT, "stop": ["a", ""]}, False),
    ("ChatCompletionRequest", {**CHAT, "tools": [{"type": "function"}]}, False),
    ("ChatCompletionRequest", {**CHAT, "stream_options": {"include_usage": "yes"}}, False),
    ("ChatCompletionRequest", {**CHAT, "messages": []}, False),
    ("ChatCompletionRequest", {**CHAT, "messages": [{"role": "tool", "content": "x"}]}, False),
    ("MessagesRequest", {"model": "chat", "max_tokens": 8, "messages": MSG}, True),
    ("MessagesRequest", {"model": "chat", "max_tokens": 8, "messages": MSG, "system": "Be brief.", "top_k": 5,
                         "metadata": {"user_id": "u-1"}, "stop_sequences": ["\n"], "temperature": 0.5}, True),
    ("MessagesRequest", {"model": "chat", "messages": MSG}, False),
    ("MessagesRequest", {"model": "chat", "max_tokens": 8, "messages": MSG, "temperature": 1.5}, False),
    ("MessagesRequest", {"model": "chat", "max_tokens": 8, "messages": []}, False),
    ("MessagesRequest", {"model": "chat", "max_tokens": 8, "messages": MSG, "mcp_servers": [{"url": "x"}]}, False),
    ("CountTokensRequest", {"model": "chat", "messages": MSG}, True),
    ("ResponsesRequest", {"model": "chat", "input": "hi", "instructions": "Be brief.", "max_output_tokens": 8,
                          "store": False, "reasoning": {"effort": "low"}}, True),
    ("ResponsesRequest", {"model": "chat", "input": MSG, "text": {"format": {"type": "json_object"}}}, True),
    ("ResponsesRequest", {"model": "chat", "input": "hi", "max_output_tokens": 0}, False),
    ("ResponsesRequest", {"model": "chat", "input": []}, False),
    ("ResponsesRequest", {"model": "chat", "input": "hi", "stream": "yes"}, False),
    ("CompletionRequest", {"model": "chat", "prompt": "a"}, True),
    ("CompletionRequest", {"model": "chat", "prompt": [1, 2]}, True),
    ("CompletionRequest", {"model": "chat", "prompt": ["a"]}, True),
    ("CompletionRequest", {"model": "chat", "prompt": ["a", "b"]}, False),
    ("CompletionRequest", {"model": "chat", "prompt": ""}, False),
    ("CompletionRequest", {"model": "chat", "prompt": []}, False),
    ("CompletionRequest", {"model": "chat", "prompt": [-1]}, False),
    ("CompletionRequest", {"model": "chat", "prompt": "a", "echo": True}, False),
    ("CompletionRequest", {"model": "chat", "prompt": "a", "n": 2, "logprobs": 3, "logit_bias": {"1": 5}}, True),
    ("CompletionRequest", {"model": "chat", "prompt": "a", "logprobs": 6}, False),
    ("ImageGenerationRequest", {"prompt": "a red car", "n": 2, "size": "64x64", "response_format": "b64_json"}, True),
    ("ImageGenerationRequest", {"prompt": "a red car", "model": "painter", "user": "u-1", "style": None}, True),
    ("ImageGenerationRequest", {"prompt": "a red car", "n": "2"}, False),
    ("ImageGenerationRequest", {"prompt": "a red car", "n": True}, False),
    ("ImageGenerationRequest", {"prompt": "a red car", "n": 0}, False),
    ("ImageGenerationRequest", {"prompt": "a red car", "response_format": "url"}, False),
    ("ImageGenerationRequest", {"prompt": "a red car", "size": "large"}, False),
    ("ImageGenerationRequest", {"prompt": ""}, False),
]


@pytest.mark.parametrize(("name", "body", "valid"), AGREEMENT)
def test_the_request_schemas_accept_what_the_server_accepts(server, name, body, valid):
    components = document()["components"]
    schema = {"$ref": f"#/components/schemas/{name}", "components": components}
    assert jsonschema.Draft202012Validator(schema).is_valid(body) is valid
    path = next(path for path, model in POSTS.items() if model == name)
    response = requests.post(f"{server}{path}", json=body, headers=AUTH, timeout=30)
    assert response.status_code == (200 if valid else 400), response.text


# -- the live server, fuzzed -------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_the_server_answers_as_its_schema_says(api_schema, server, method, path):
    """Valid and invalid requests: never a 5xx; status, content type, headers and body as declared."""
    operation = api_schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

    @given(case=cases, model=st.sampled_from(["chat", "painter", None]))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def conforms(case, model):
        if model and isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
            case.body["model"] = model  # mostly a served model, or nearly every request would stop at a 404
        case.call_and_validate(base_url=server, headers=AUTH, checks=CHECKS, timeout=30)

    conforms()


# Numbers at the edges of JSON, as literal text: integers of 1 to 5,000 digits (Python converts at most 4,300),
# the least and greatest doubles, literals past them, and the constants Python's json reads but JSON has not.
EDGE_FLOATS = ["0.0", "-0.0", "5e-324", "1e-320", "1.7976931348623157e308", "-1.7976931348623157e308", "1e999",
               "-1e999", "NaN", "Infinity", "-Infinity"]
EDGE_NUMBERS = st.one_of(
    st.builds(lambda sign, digit, digits: sign + digit * digits, st.sampled_from(["", "-"]), st.sampled_from("19"),
              st.sampled_from([1, 19, 20, 300, 4300, 4301, 5000])),
    st.sampled_from(EDGE_FLOATS))
EDGE_EXAMPLES = min(30, settings.default.max_examples)


def number_slots(model):
    """The fields of a request schema that take numbers: field -> its JSON text around a number (``{}``)."""
    slots = {}
    for name, schema in document()["components"]["schemas"][model]["properties"].items():
        for option in schema.get("anyOf", [schema]):
            if option.get("type") in ("integer", "number"):
                slots[name] = "{}"
            elif option.get("type") == "object" and isinstance(option.get("additionalProperties"), dict) \
                    and option["additionalProperties"].get("type") == "number":
                slots[name] = '{{"3": {}}}'
            elif option.get("type") == "array" and option.get("items", {}).get("type") == "integer":
                slots[name] = "[1, {}]"
    return slots


@pytest.mark.parametrize("path", POSTS)
def test_numbers_at_the_edges_of_json_are_never_a_server_error(api_schema, server, path):
    """Bodies from the schema whose numbers are edge literals, sent as written: a 4xx in the protocol's shape, or
    served."""
    operation = api_schema[path]["POST"]
    slots = number_slots(POSTS[path])
    marker = "edge-number-7f3a"

    @given(case=operation.as_strategy(GenerationMode.POSITIVE), data=st.data())
    @settings(max_examples=EDGE_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def never_a_server_error(case, data):
        numbers = []

        def edge(value):  # a placeholder the JSON text carries until the literal replaces it
            numbers.append(value)
            return f"{marker}-{len(numbers) - 1}"

        def replaced(value):  # the generated body, some of its numbers (at any depth) swapped for edge ones
            if isinstance(value, dict):
                return {k: replaced(v) for k, v in value.items()}
            if isinstance(value, list):
                return [replaced(v) for v in value]
            if isinstance(value, int | float) and not isinstance(value, bool) and data.draw(st.booleans()):
                return edge(data.draw(EDGE_NUMBERS))
            return value

        body = replaced(case.body if isinstance(case.body, dict) else {})
        body["model"] = "painter" if path == "/v1/images/generations" else "chat"  # past the 404, to be served
        for field in data.draw(st.lists(st.sampled_from(sorted(slots)), min_size=1, max_size=3, unique=True)):
            body[field] = edge(slots[field].format(data.draw(EDGE_NUMBERS)))
        text = json.dumps(body)
        for i, number in enumerate(numbers):
            text = text.replace(f'"{marker}-{i}"', number)
        response = requests.post(f"{server}{path}", data=text.encode(), timeout=30,
                                 headers={**AUTH, "Content-Type": "application/json"})
        assert response.status_code < 500, (text[:300], response.text[:300])
        if response.status_code >= 400:
            error = response.json()["error"]
            fields = {"message", "type"} if path in ANTHROPIC else {"message", "type", "param", "code"}
            assert set(error) == fields and error["message"], error
        case.validate_response(response, checks=CHECKS)

    never_a_server_error()


# -- error paths, driven on purpose ------------------------------------------------------


def test_errors_that_need_a_situation_conform_to_the_schema(monkeypatch):
    """401, 413, 404, 429 (with its headers), 503 of a dead engine and of a draining server, readiness 503."""
    import fairagents.server.incoming as incoming

    arbiter = pool(in_flight=1, manual=True)
    config = make_config(apps={"driving": {"api_key": KEYS["driving"], "max_queued": 1}})
    with serving(arbiter, config) as (url, gateway, loop), requests.Session() as http:
        api = schemathesis.openapi.from_url(f"{url}/openapi.json")
        chat = api["/v1/chat/completions"]["POST"]
        models = api["/v1/models"]["GET"]
        health = api["/health"]["GET"]
        engine = arbiter.engine("chat")

        def send(operation, key=KEYS["driving"], **kwargs):
            case = operation.Case(**kwargs)
            response = case.call(base_url=url, session=http, headers={"Authorization": f"Bearer {key}"}, timeout=30)
            case.validate_response(response, checks=CHECKS[1:])  # a 503 is the point here, not a server error
            return response

        body = {"model": "chat", "messages": MSG, "max_tokens": 2}
        assert send(chat, key="sk-wrong", body=body).status_code == 401
        assert send(models, key="sk-wrong").status_code == 401
        monkeypatch.setattr(incoming, "MAX_BODY_BYTES", 100)
        assert send(chat, body={**body, "messages": [{"role": "user", "content": "word " * 100}]}).status_code == 413
        monkeypatch.undo()
        assert send(chat, body={**body, "model": "gpt-9"}).status_code == 404

        # one request runs (the manual engine holds it), one waits: a third is past the app's bound
        with concurrent.futures.ThreadPoolExecutor(2) as waiting:
            try:
                held = [waiting.submit(send, chat, body=body)]
                wait_until(lambda: in_loop(loop, lambda: len(engine.running)) == 1)
                held.append(waiting.submit(send, chat, body=body))
                wait_until(lambda: in_loop(loop, lambda: arbiter.stats().apps["driving"].queued) == 1)
                refused = send(chat, body=body)
                assert refused.status_code == 429 and int(refused.headers["retry-after"][0]) >= 1
            finally:
                in_loop(loop, engine.fail)  # the held requests fail as the engine dies
            assert [f.result().status_code for f in held] == [503, 503]
        assert send(health).status_code in (200, 503)  # degraded until the model is back
        gateway.draining = True
        assert send(models).json()["error"]["code"] == "shutting_down"
        assert send(health).json()["status"] == "draining"
