"""LangChain's standard test suites for chat models (``langchain-tests``), run against ChatFairAgents.

- The unit suites build models and check what needs no model: in process (over a FakeEngine pool) and for a server.
- The integration suites call the embedded real model (random weights) on vLLM: in process, through one portal the
  package's tests share, so the suite's sync and async tests reach the same arbiter; and over HTTP, against a
  ``fairagents serve`` subprocess on loopback.

The model's text is noise, but its forced tool calls and structured output are valid: fairagents has vLLM enforce
their JSON schemas while decoding. The tests that need a model that understands language (one that fills a call's
arguments with what was asked, calls a tool unprompted under ``tool_choice="auto"``, writes the keys a prompt names,
or ends a string of unbounded length) are expected to fail, each with its reason. Image inputs (in user messages and in
tool results) go to the embedded vision model (``vision_model``), whose template offers tools too; the suite's image,
which LangChain's tests download, is made here instead (no network). Audio and PDF inputs stay off: no model of the
pool reads them. A call may name another model of the pool (``model=``): in process a scripted one, over HTTP
the vision model.
"""

import io
from types import SimpleNamespace

import pytest
from fairagents_langgraph import ChatFairAgents
from langchain_core.exceptions import OutputParserException
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

import fairagents as fa
from fairagents.testing import FakeEngine
from tests.integrations.conftest import STANDARD as APP
from tests.integrations.conftest import STANDARD_AGENT as AGENT
from tests.integrations.conftest import STANDARD_KEY as KEY
# Every call of the integration suites: a fixed seed, so a run repeats; room for a forced call's JSON; one call per
# turn (a random model's array of calls has no end: a real model stops where it means to).
CALLS = {"model": "chat", "vision_model": "vision", "max_tokens": 128, "seed": 7, "parallel_tool_calls": False}

# -- unit suites ---------------------------------------------------------------------------


class TestInProcessUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self):
        return ChatFairAgents

    @property
    def chat_model_params(self):
        arbiter = fa.Arbiter()
        arbiter.add_model("chat", FakeEngine())
        return {"arbiter": arbiter, "model": "chat"}

    @property
    def has_tool_choice(self):
        return True

    @property
    def supports_json_mode(self):
        return True


class TestServerUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self):
        return ChatFairAgents

    @property
    def chat_model_params(self):
        return {"base_url": "http://127.0.0.1:8000/v1", "model": "chat", "agent": AGENT}

    @property
    def has_tool_choice(self):
        return True

    @property
    def supports_json_mode(self):
        return True


# -- integration suites on the embedded model ----------------------------------------------


RANDOM = "the embedded model has random weights: "
ARGUMENTS = pytest.mark.xfail(
    reason=RANDOM + "its forced call is a valid call of the tool, but its arguments are noise, not those asked for",
    raises=AssertionError,
)
UNPROMPTED = pytest.mark.xfail(
    reason=RANDOM + "under tool_choice='auto' it does not choose to call a tool", raises=AssertionError
)
UNBOUNDED = pytest.mark.xfail(
    reason=RANDOM + "in a string without maxLength it seldom writes the closing quote (3 of 12 two-string answers "
    "closed within 1,024 tokens), so the call or answer is cut off by max_tokens before its JSON is complete "
    "(decoding guarantees the shape, not the length; compact JSON saves the padding, not the string)",
    raises=(AssertionError, TypeError, OutputParserException),
)
KEYS = pytest.mark.xfail(
    reason="json_mode constrains the output to a JSON object, not to the schema's keys, which only a model that "
    "reads the prompt writes; " + RANDOM.rstrip(": "),
    raises=(AssertionError, OutputParserException),
)
OUTPUT_VERSIONS = pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
SCHEMA_TYPES = pytest.mark.parametrize("schema_type", ["pydantic", "typeddict", "json_schema"])


class EmbeddedModelTests(ChatModelIntegrationTests):
    """What both integration suites share: the model, its features, and what random weights cannot do."""

    @property
    def chat_model_class(self):
        return ChatFairAgents

    @property
    def has_tool_calling(self):
        return True

    @property
    def has_tool_choice(self):
        return True

    @property
    def has_structured_output(self):
        return True

    @property
    def supports_json_mode(self):
        return True

    @property
    def returns_usage_metadata(self):
        return True

    @property
    def supports_anthropic_inputs(self):
        return True

    @property
    def supports_image_inputs(self):
        return True

    @property
    def supports_image_tool_message(self):
        return True

    @property
    def supports_image_urls(self):
        return False  # an image given by URL: fairagents fetches none unless configured to (and here is no network)

    @pytest.fixture(autouse=True)
    def _offline_image(self, monkeypatch):
        """LangChain's image tests download a PNG: they get one made here."""
        import langchain_tests.integration_tests.chat_models as suite
        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (96, 64), (40, 120, 200)).save(buffer, format="PNG")

        def get(url, **kwargs):
            assert url.endswith(".png"), url  # the suite's image, nothing else
            return SimpleNamespace(content=buffer.getvalue())

        monkeypatch.setattr(suite, "httpx", SimpleNamespace(get=get))

    @ARGUMENTS
    @OUTPUT_VERSIONS
    def test_tool_calling(self, model):
        super().test_tool_calling(model)

    @ARGUMENTS
    async def test_tool_calling_async(self, model):
        await super().test_tool_calling_async(model)

    @UNBOUNDED  # under "any" it may call get_weather, whose location is an unbounded string (with seed 7, it does)
    def test_tool_choice(self, model):
        super().test_tool_choice(model)

    @UNBOUNDED
    def test_unicode_tool_call_integration(self, model, *, tool_choice=None, force_tool_call=True):
        super().test_unicode_tool_call_integration(model, tool_choice=tool_choice, force_tool_call=force_tool_call)

    @UNBOUNDED
    def test_bind_runnables_as_tools(self, model):
        super().test_bind_runnables_as_tools(model)

    @UNBOUNDED
    @SCHEMA_TYPES
    def test_structured_output(self, model, schema_type):
        super().test_structured_output(model, schema_type)

    @UNBOUNDED
    @SCHEMA_TYPES
    async def test_structured_output_async(self, model, schema_type):
        await super().test_structured_output_async(model, schema_type)

    @UNBOUNDED
    def test_structured_output_pydantic_2_v1(self, model):
        super().test_structured_output_pydantic_2_v1(model)

    @UNBOUNDED
    def test_structured_output_optional_param(self, model):
        super().test_structured_output_optional_param(model)

    @KEYS
    def test_json_mode(self, model):
        super().test_json_mode(model)

    @UNPROMPTED
    @OUTPUT_VERSIONS
    def test_agent_loop(self, model):
        super().test_agent_loop(model)


@pytest.mark.engine
class TestInProcess(EmbeddedModelTests):
    @pytest.fixture(autouse=True)
    def _portal(self, embedded_portal):
        self.portal = embedded_portal

    @property
    def chat_model_params(self):
        return {"portal": self.portal, "agent": self.portal.arbiter.app(APP).agent(AGENT), **CALLS}

    @property
    def model_override_value(self):
        return "echo"


@pytest.mark.engine
class TestServer(EmbeddedModelTests):
    @pytest.fixture(autouse=True)
    def _server(self, fairagents_server):
        self.base_url = fairagents_server

    @property
    def chat_model_params(self):
        return {"base_url": self.base_url, "api_key": KEY, "agent": AGENT, **CALLS}

    @property
    def model_override_value(self):
        return "vision"  # the server's other model (it reads text too)

