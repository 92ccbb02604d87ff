"""Server configuration: TOML and YAML, validation, the default pool, building the arbiter."""

import pytest
from pydantic import ValidationError

import fairagents as fa
from fairagents.server import Config, build_arbiter, create_app, load_config

TOML = """
policy = "vtc"

[server]
port = 9001
drain_timeout = 5

[models.chat]
in_flight = 8
max_model_len = 512

[apps.driving]
api_key = "sk-driving"
weight = 2.0
max_queued = 16
slo = { ttft = 2.0 }
agents.planner = { weight = 3.0, slo = { ttft = 0.5 } }

[apps.studio]
api_key_env = "FAIRAGENTS_TEST_STUDIO_KEY"
"""

YAML = """
policy: fcfs
pool_in_flight: 6
server: {auth: false}
models:
  small: {max_num_seqs: 4}
apps:
  local: {weight: 3}
"""


def test_toml_builds_the_pool_and_declares_apps_and_agents(tmp_path, monkeypatch):
    monkeypatch.setenv("FAIRAGENTS_TEST_STUDIO_KEY", "sk-studio")
    path = tmp_path / "serve.toml"
    path.write_text(TOML)
    config = load_config(path)
    assert (config.policy, config.server.port, config.server.drain_timeout) == ("vtc", 9001, 5.0)
    arbiter = build_arbiter(config)
    assert arbiter.models == ["chat"] and arbiter.in_flight_limit("chat") == 8 and arbiter.drain_timeout == 5.0
    assert arbiter.engine("chat").max_model_len == 512  # an unstarted engine: nothing loaded
    gateway = create_app(arbiter, config).state.gateway
    assert gateway.app_for_key("sk-driving") == "driving" and gateway.app_for_key("sk-studio") == "studio"
    planner = arbiter.app("driving", 2.0, fa.SLO(ttft=2.0), max_queued=16).agent("planner", 3.0, fa.SLO(ttft=0.5))
    assert planner.identity.effective_slo == fa.SLO(ttft=0.5)


def test_yaml_with_keys_off(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(YAML)
    config = load_config(path)
    assert config.policy == "fcfs" and not config.server.auth and config.apps["local"].weight == 3.0
    arbiter = build_arbiter(config)
    assert arbiter.in_flight_limit("small") == 4 and arbiter.pool_in_flight == 6
    assert build_arbiter(Config.default()).pool_in_flight is None


def test_engines_made_elsewhere_must_be_configured_models():
    from fairagents.testing import FakeEngine

    with pytest.raises(fa.InvalidParameterError, match="vision"):
        build_arbiter(Config.default(), engines={"vision": FakeEngine()})


def test_the_default_serves_the_embedded_model_with_keys_off():
    config = Config.default()
    assert list(config.models) == ["chat"] and config.models["chat"].path is None
    assert not config.server.auth and config.server.host == "127.0.0.1"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("polcy = 'hmfs'\n[server]\nauth = false", "polcy: Extra inputs are not permitted"),
        ("policy = 'lottery'\n[server]\nauth = false", "unknown policy 'lottery'"),
        ("[apps.a]\nweight = 1", "app 'a' has none"),
        ("", "no app is declared"),
        ("[apps.a]\napi_key = 'k'\n[apps.b]\napi_key = 'k'", "apps 'a' and 'b' have the same API key"),
        ("[apps.a]\napi_key = 'k'\nweight = 0", "apps.a.weight: Input should be greater than or equal to 0.001"),
        ("[apps.a]\napi_key = 'k'\nweight = 1e-320", "apps.a.weight: Input should be greater than or equal to 0.001"),
        ("[apps.a]\napi_key = 'k'\nweight = 1e4", "apps.a.weight: Input should be less than or equal to 1000"),
        ("[apps.a]\napi_key = 'k'\nweight = inf", "apps.a.weight: Input should be less than or equal to 1000"),
        ("[apps.a]\napi_key = 'k'\nslo = { ttft = 1e-320 }", "apps.a.slo.ttft: Input should be greater than or equal"),
        ("[apps.a]\napi_key = 'k'\n[apps.a.agents.x]\nweight = 5e-324", "apps.a.agents.x.weight: Input should be"),
        ("w_output = 1e308", "w_output: Input should be less than or equal to 1000"),
        ("[apps.a]\napi_key = 'k'\nmax_queued = 0", "apps.a.max_queued"),
        ("[apps.a]\napi_key = 'k'\napi_key_env = 'K'", "not both"),
        ("[apps.'a/b']\napi_key = 'k'", "app name must be"),
        ('[apps."a\\n"]\napi_key = \'k\'', "app name must be"),  # a trailing newline
        ("[server]\nauth = false\nstream_stall_timeout = 0", "server.stream_stall_timeout"),
        ("[apps.a]\napi_key = 'k'\n[apps.a.agents.'x/y']\nweight = 1", "agent name must be"),
        ("[apps.a]\napi_key = 'k'\n[apps.a.agents._other]\nweight = 1", "agent name '_other' is reserved"),
        ("[apps._other]\napi_key = 'k'", "app name '_other' is reserved"),
        ("[server]\nauth = false\nport = 70000", "server.port"),
        ("[server]\nauth = false\n[models.m]\nengine = 'tgi'", "models.m.engine"),
        ("token_budget = 0\n[server]\nauth = false", "token_budget"),
        ("[server]\nauth = false\n[models.m]\ntoken_budget = 'lots'", "models.m.token_budget"),
        ("[server\n", "Expected"),
    ],
)
def test_a_bad_file_is_a_typed_value_error_naming_the_field(tmp_path, text, message):
    path = tmp_path / "serve.toml"
    path.write_text(text)
    with pytest.raises(fa.InvalidParameterError, match="serve.toml") as info:
        load_config(path)
    assert message in str(info.value) and isinstance(info.value, ValueError)


def test_unreadable_or_unknown_files(tmp_path):
    with pytest.raises(fa.InvalidParameterError, match="No such file"):
        load_config(tmp_path / "missing.toml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(fa.InvalidParameterError, match="top level"):
        load_config(tmp_path / "list.yaml")


def test_a_key_from_an_unset_environment_variable_is_an_error(monkeypatch):
    monkeypatch.delenv("FAIRAGENTS_TEST_UNSET", raising=False)
    config = Config.model_validate({"apps": {"a": {"api_key_env": "FAIRAGENTS_TEST_UNSET"}}})
    with pytest.raises(fa.InvalidParameterError, match="FAIRAGENTS_TEST_UNSET"):
        create_app(fa.Arbiter(), config)


def test_two_environment_variables_with_one_key_are_an_error(monkeypatch):
    monkeypatch.setenv("FAIRAGENTS_TEST_K1", "same")
    monkeypatch.setenv("FAIRAGENTS_TEST_K2", "same")
    config = Config.model_validate({"apps": {"a": {"api_key_env": "FAIRAGENTS_TEST_K1"}, "b": {"api_key_env": "FAIRAGENTS_TEST_K2"}}})
    with pytest.raises(fa.InvalidParameterError, match="same API key"):
        create_app(fa.Arbiter(), config)


def test_exported_names_are_sorted_and_documented():
    from fairagents import server

    assert server.__all__ == sorted(server.__all__)
    for name in server.__all__:
        obj = getattr(server, name)
        if not isinstance(obj, str):
            assert "Examples:" in (obj.__doc__ or ""), name


def guide_config(page, tmp_path, monkeypatch, start=""):
    """The first TOML block of ``docs/guides/<page>`` (that starts with ``start``), loaded as written, its keys set."""
    import re
    from pathlib import Path

    from fairagents.server import load_config

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / page).read_text()
    toml = re.search(rf"```toml\n({re.escape(start)}.*?)```", guide, re.S).group(1)
    (tmp_path / "serve.toml").write_text(toml)
    for name in re.findall(r'api_key_env = "(\w+)"', toml):
        monkeypatch.setenv(name, f"sk-{name.lower()}")
    return load_config(tmp_path / "serve.toml")


def test_the_guides_configuration_validates_and_builds_every_engine_kind(tmp_path, monkeypatch):
    from fairagents.engines.diffusion import DiffusionEngine
    from fairagents.engines.vision import VisionEngine
    from fairagents.engines.vllm import VLLMEngine

    config = guide_config("server.md", tmp_path, monkeypatch)
    engines = {name: model.build() for name, model in config.models.items()}  # built, not started
    assert type(engines["chat"]) is VLLMEngine and engines["chat"].max_num_seqs == 32
    assert isinstance(engines["vision"], VisionEngine) and isinstance(engines["image"], DiffusionEngine)
    assert engines["image"].max_size == 256


async def test_token_budgets_come_from_the_engine_a_number_or_are_off():
    from fairagents.testing import FakeEngine

    config = Config.model_validate({
        "server": {"auth": False}, "token_budget": 512,
        "models": {"a": {}, "b": {"token_budget": "engine"}, "c": {"token_budget": "off"}},
    })
    arbiter = build_arbiter(config, engines={m: FakeEngine(token_capacity=128) for m in "abc"})
    async with arbiter:
        assert [arbiter.token_budget_of(m) for m in "abc"] == [512, 128, None]


def test_a_models_device_is_configured_or_its_default():
    from fairagents.testing import FakeEngine

    config = Config.model_validate({"server": {"auth": False}, "models": {
        "chat": {}, "vision": {}, "image": {"device": "gpu1"}, "remote": {}}})
    engines = {"chat": FakeEngine(), "vision": FakeEngine(), "image": FakeEngine(),
               "remote": FakeEngine(shared_capacity=True)}
    arbiter = build_arbiter(config, engines=engines)
    assert arbiter.devices == {"local": ["chat", "vision"], "gpu1": ["image"], "remote": ["remote"]}
    with pytest.raises(ValidationError, match="device"):
        Config.model_validate({"models": {"chat": {"device": ""}}})


def test_a_model_on_remote_replicas():
    from fairagents.engines.remote import OpenAIEngine

    config = Config.model_validate({"server": {"auth": False}, "models": {"chat": {
        "engine": "openai", "urls": ["http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1"], "d_model": 896,
        "n_layers": 24, "served_model_name": "qwen", "api_key": "sk-replicas", "max_num_seqs": 16}}})
    engine = config.models["chat"].build("chat")
    assert isinstance(engine, OpenAIEngine)
    assert (engine.model, engine.api_key, engine.max_num_seqs) == ("qwen", "sk-replicas", 32)
    assert [r.url for r in engine.replicas] == ["http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1"]
    with pytest.raises(ValidationError, match="needs the model's files"):
        Config.model_validate({"models": {"chat": {"engine": "openai", "urls": ["http://x/v1"]}}})
    with pytest.raises(ValidationError, match="urls are for"):
        Config.model_validate({"models": {"chat": {"urls": ["http://x/v1"]}}})


def test_every_commented_line_of_the_guides_configuration_is_valid_once_uncommented(tmp_path, monkeypatch):
    """Each ``# key = value`` of the guide's configuration works as written when a reader uncomments it, all at once."""
    import re
    import tomllib
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "server.md").read_text()
    toml = re.search(r"```toml\n(.*?)```", guide, re.S).group(1)
    commented = [line for line in toml.splitlines() if line.lstrip().startswith("#")]
    assert len(commented) > 10  # the examples are there
    uncommented = re.sub(r"^(\s*)# ?", r"\1", toml, flags=re.M)
    tomllib.loads(uncommented)  # each line alone: the test below, over every page
    (tmp_path / "serve.toml").write_text(uncommented)
    for name in re.findall(r'api_key_env = "(\w+)"', uncommented):
        monkeypatch.setenv(name, f"sk-{name.lower()}")
    config = load_config(tmp_path / "serve.toml")
    assert config.apps["flood"].max_in_flight_share == 0.25 and config.apps["flood"].default_max_tokens == 256
    assert (config.restart.attempts, config.admission.band, config.d_base) == (5, (0.8, 0.95), 4096)
    assert config.server.default_max_tokens == 1024


def test_a_policy_of_your_own_is_read_as_module_and_class(tmp_path, monkeypatch):
    from fairagents.testing import FakeEngine

    from ._support import write_guide_policy

    monkeypatch.syspath_prepend(str(tmp_path))
    spec = write_guide_policy(tmp_path, "guide_policy_config")
    (tmp_path / "serve.toml").write_text(f'policy = "{spec}"\n[server]\nauth = false\n')
    config = load_config(tmp_path / "serve.toml")
    assert config.policy == spec
    arbiter = build_arbiter(config, engines={"chat": FakeEngine()})
    assert arbiter.policy.name == "ttft-deadline" and type(arbiter.policy).__module__ == "guide_policy_config"


@pytest.mark.parametrize(("module", "policy", "message"), [
    (None, "no_such_module_here:Policy", "policy 'no_such_module_here:Policy': no module named 'no_such_module_here'"),
    ("import no_such_dependency_here\n", "{m}:Policy", "importing '{m}' failed: ModuleNotFoundError: No module named"),
    ("x = (\n", "{m}:Policy", "importing '{m}' failed: SyntaxError"),
    ("", "{m}:Policy", "policy '{m}:Policy': module '{m}' has no attribute 'Policy'"),
    ("def Policy():\n    raise RuntimeError('no GPU here')\n", "{m}:Policy", "Policy() failed: RuntimeError: no GPU here"),
    ("Policy = 3\n", "{m}:Policy", "Policy is not a class or factory, it is 3"),
    ("class Policy:\n    pass\n", "{m}:Policy", "Policy() returned Policy, not a policy"),
    (None, "{m}:", "a policy is a name (adaptive, duet"),
])
def test_a_policy_that_does_not_import_or_build_is_a_one_line_error_naming_what_failed(
    tmp_path, monkeypatch, module, policy, message,
):
    name = f"bad_policy_{abs(hash((module, policy))) % 10**8}"
    if module is not None:
        (tmp_path / f"{name}.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "serve.toml").write_text(f'policy = "{policy.format(m=name)}"\n[server]\nauth = false\n')
    with pytest.raises(fa.InvalidParameterError) as info:
        load_config(tmp_path / "serve.toml")
    text = str(info.value)
    assert message.format(m=name) in text and "\n" not in text and text.startswith(f"{tmp_path / 'serve.toml'}: policy: ")


def test_default_max_tokens_of_the_server_and_of_an_app():
    config = Config.model_validate({"apps": {
        "a": {"api_key": "ka"}, "b": {"api_key": "kb", "default_max_tokens": 64},
        "c": {"api_key": "kc", "default_max_tokens": "context"}}})
    assert config.server.default_max_tokens == 1024  # the server's default; the library's is the context
    assert [config.apps[n].default_max_tokens for n in "abc"] == [None, 64, "context"]
    assert Config.model_validate({"server": {"auth": False, "default_max_tokens": "context"}}).server.default_max_tokens \
        == "context"
    for bad in (0, "all", 1.5):
        with pytest.raises(ValidationError, match="default_max_tokens"):
            Config.model_validate({"server": {"auth": False, "default_max_tokens": bad}})


def test_every_commented_line_of_a_configuration_in_the_docs_is_toml_once_uncommented():
    import re
    import tomllib
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    seen = 0
    for page in sorted(docs.rglob("*.md")):
        for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.S):
            for line in (line for line in block.splitlines() if line.lstrip().startswith("#")):
                seen += 1
                try:
                    tomllib.loads(re.sub(r"^(\s*)# ?", r"\1", line))
                except tomllib.TOMLDecodeError as err:
                    raise AssertionError(f"{page.relative_to(docs)}: not TOML once uncommented: {line!r} ({err})") from None
    assert seen > 10


def test_the_coding_agents_guides_configuration_loads(tmp_path, monkeypatch):
    """The server configuration the coding-agents guide shows loads as written, with its identity rules."""
    config = guide_config("coding-agents.md", tmp_path, monkeypatch, start="[server]")
    assert [(r.source, r.to, r.value) for r in config.server.identity][:2] == [
        ("header:x-claude-code-session-id", "run", None), ("header:x-claude-code-agent-id", "agent", "subagent")]
    assert config.models["chat"].max_model_len == 98304 and config.apps["payments"].default_max_tokens == "context"
