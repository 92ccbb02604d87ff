"""What ``fairagents serve`` serves, to whom: models, apps with their API keys, agents, policy.

A configuration is TOML or YAML, validated with pydantic; a mistake (an unknown field,
a weight ≤ 0, two apps with one key, keys on but an app without one) is an
:class:`~fairagents.InvalidParameterError` naming the field, raised before anything starts.

.. code-block:: toml

    policy = "hmfs_credit"
    pool_in_flight = 24           # optional: the models share one GPU, so one limit for all

    [server]
    host = "127.0.0.1"
    port = 8000
    drain_timeout = 30.0
    counters = "redis://127.0.0.1:6379/0"   # optional: several servers, one fair share

    [models.chat]                 # the OpenAI "model" name clients send
    path = "Qwen/Qwen2.5-0.5B-Instruct"
    in_flight = 16
    token_budget = "engine"       # the default: KV tokens reserved at once, from the engine
    device = "gpu0"               # optional: models of one device take one order (default: in-process share one)

    [apps.driving]
    api_key_env = "DRIVING_KEY"   # or api_key = "..."
    weight = 2.0
    max_queued = 64
    agents.planner = { weight = 2.0, slo = { ttft = 1.0 } }

Examples:
    >>> from fairagents.server import Config
    >>> config = Config.model_validate({
    ...     "apps": {"driving": {"api_key": "sk-driving", "weight": 2.0, "agents": {"planner": {"weight": 2.0}}}},
    ... })
    >>> config.apps["driving"].agents["planner"].weight, config.server.auth, list(config.models)
    (2.0, True, ['chat'])
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from fairagents.admission import Statera
from fairagents.runtime.arbiter import Arbiter, Restart
from fairagents.constants import DEFAULT_D_BASE, MAX_MODEL_DEPTH, MAX_MODEL_WIDTH, MAX_TOKEN_PRICE
from fairagents.cost import DEFAULT_W_CACHED, ModelProfile
from fairagents.engines.base import Engine
from fairagents.errors import InvalidParameterError
from fairagents.identity import SLO, SLO_RANGE, WEIGHT_RANGE
from fairagents.limits import DEFAULT_LIMITS, RequestLimits
from fairagents.policies import DEFAULT_POLICY, POLICIES, make_policy
from fairagents.server.identity_rules import IdentityRule, check_name

__all__ = [
    "AgentConfig", "AppConfig", "Config", "CountersConfig", "ImageFetchConfig", "LimitsConfig", "ModelConfig", "RestartConfig", "SLOConfig", "ServerSettings", "build_arbiter",
    "load_config",
]

#: Most agents an app may have when its configuration does not say.
DEFAULT_MAX_AGENTS = 64

#: Output tokens of a request that sets no ``max_tokens``, unless ``server.default_max_tokens`` says
#: otherwise: most chat answers fit, and a request reserves ``prompt + max_tokens`` of its model's
#: token budget while it runs, where the rest of a long context would let few run at once.
DEFAULT_MAX_TOKENS = 1024

#: A default ``max_tokens``: a number of tokens, or ``"context"``: the rest of the context after the prompt.
DefaultMaxTokens = Annotated[int, Field(ge=1)] | Literal["context"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SLOConfig(_Section):
    """Latency objectives in seconds (see :class:`~fairagents.SLO`).

    Examples:
        >>> from fairagents.server import SLOConfig
        >>> SLOConfig(ttft=1.0).build()
        SLO(ttft=1.0, tpot=None, e2e=None)
    """

    ttft: float | None = Field(default=None, ge=SLO_RANGE[0], le=SLO_RANGE[1])
    """Time to first token (seconds)."""
    tpot: float | None = Field(default=None, ge=SLO_RANGE[0], le=SLO_RANGE[1])
    """Mean time per output token after the first (seconds)."""
    e2e: float | None = Field(default=None, ge=SLO_RANGE[0], le=SLO_RANGE[1])
    """Arrival to last token (seconds)."""

    def build(self) -> SLO:
        """The :class:`~fairagents.SLO` this section describes."""
        return SLO(ttft=self.ttft, tpot=self.tpot, e2e=self.e2e)


class AgentConfig(_Section):
    """An agent of an app, named by clients in the ``X-Fairagents-Agent`` header.

    Examples:
        >>> from fairagents.server import Config
        >>> config = Config.model_validate({"server": {"auth": False},
        ...                                 "apps": {"studio": {"agents": {"writer": {"weight": 2.0}}}}})
        >>> config.apps["studio"].agents["writer"].weight
        2.0
    """

    weight: float = Field(default=1.0, ge=WEIGHT_RANGE[0], le=WEIGHT_RANGE[1])
    """Share of its app relative to the app's other agents."""
    slo: SLOConfig | None = None


class AppConfig(_Section):
    """An app: its API key, weight, queue bound and agents.

    Agents not listed here are declared on first use, up to ``max_agents``, with the weight
    and SLO their request states (``X-Fairagents-Agent-Weight``, ``X-Fairagents-Agent-Slo``;
    weight 1 otherwise). Listed ones keep the settings given here.

    Examples:
        >>> from fairagents.server import AppConfig
        >>> app = AppConfig(api_key="sk-1", weight=2.0)
        >>> app.key(), app.max_queued
        ('sk-1', 256)
    """

    api_key: SecretStr | None = None
    """The bearer key that identifies the app (server mode with keys on)."""
    api_key_env: str | None = None
    """Name of an environment variable that holds the key, instead of ``api_key``."""
    weight: float = Field(default=1.0, ge=WEIGHT_RANGE[0], le=WEIGHT_RANGE[1])
    """Share of the pool relative to other apps."""
    max_queued: int | None = Field(default=256, ge=1)
    """Most requests the app may have waiting for one model; past it, 429 (``None``: unbounded)."""
    max_in_flight_share: float | None = Field(default=None, gt=0, le=1)
    """Largest share of a model's slots and token budget the app may hold (unset: the top-level setting)."""
    default_max_tokens: DefaultMaxTokens | None = None
    """Output tokens of the app's requests that set no ``max_tokens`` (a number, or ``"context"``:
    the rest of the context); unset, ``server.default_max_tokens``."""
    slo: SLOConfig | None = None
    """Default SLO of the app's agents."""
    agents: dict[str, AgentConfig] = Field(default_factory=dict)
    max_agents: int = Field(default=DEFAULT_MAX_AGENTS, ge=1)
    """Most agents the app may have, listed ones included."""

    @field_validator("agents")
    @classmethod
    def _agent_names(cls, agents: dict[str, AgentConfig]) -> dict[str, AgentConfig]:
        for name in agents:
            check_name(name, "agent")
        return agents

    @model_validator(mode="after")
    def _one_key_source(self) -> AppConfig:
        if self.api_key is not None and self.api_key_env is not None:
            raise ValueError("give api_key or api_key_env, not both")
        if len(self.agents) > self.max_agents:
            raise ValueError(f"{len(self.agents)} agents listed but max_agents is {self.max_agents}")
        return self

    def key(self) -> str | None:
        """The app's API key (read from the environment for ``api_key_env``)."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env is not None:
            value = os.environ.get(self.api_key_env)
            if not value:
                raise InvalidParameterError(f"the environment variable {self.api_key_env!r} holding an API key is not set")
            return value
        return None


class ModelConfig(_Section):
    """A model of the pool and the engine that serves it.

    Examples:
        >>> from fairagents.server import Config
        >>> config = Config.model_validate({"server": {"auth": False}, "models": {"chat": {"path": "/models/qwen"}}})
        >>> config.models["chat"].path
        '/models/qwen'
    """

    engine: Literal["vllm", "vision", "diffusion", "openai"] = "vllm"
    """The engine kind: in this process ``vllm`` (text), ``vision`` (a vision-language
    model on vLLM: image parts in chat) or ``diffusion`` (image generation with
    diffusers); or ``openai``: remote OpenAI-compatible replicas (``urls``), such as
    ``vllm serve`` (:class:`~fairagents.engines.remote.OpenAIEngine`)."""
    urls: list[str] | None = None
    """``openai``: the replicas' base URLs (``http://host:port/v1``)."""
    served_model_name: str | None = None
    """``openai``: the model's name on the replicas; unset, this model's name."""
    api_key: SecretStr | None = None
    """``openai``: the replicas' API key, if they need one."""
    token_capacity: int | None = Field(default=None, ge=1)
    """``openai``: KV tokens of all replicas together; unset, read from their ``/metrics``."""
    d_model: int | None = Field(default=None, ge=1, le=MAX_MODEL_WIDTH)
    """``openai`` without ``path``: the model's hidden size, to price its tokens (prompts are
    then tokenized by the replicas)."""
    n_layers: int | None = Field(default=None, ge=1, le=MAX_MODEL_DEPTH)
    """``openai`` without ``path``: the model's number of layers."""
    path: str | None = None
    """A Hugging Face model folder or name; ``None`` serves the embedded tiny model."""
    in_flight: int | None = Field(default=None, ge=1)
    """Requests handed to the engine at once; unset, the engine's batch capacity."""
    device: str | None = Field(default=None, min_length=1, max_length=128)
    """The capacity its engine shares with other models' (:mod:`fairagents.policies.devices`): models of one
    device are served in one order, with one set of counters. Unset: in-process models share ``"local"``, a
    remote (``openai``) model is a device of its own."""
    token_budget: Literal["engine", "off"] | Annotated[int, Field(ge=1)] | None = None
    """KV tokens its running requests may reserve (``prompt + max_tokens`` each): ``"engine"``
    (the engine's KV capacity), a number of tokens, or ``"off"`` (admission by request
    count only); unset, the configuration's ``token_budget``."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Context length; unset, the model's own."""
    kv_cache_bytes: int | None = Field(default=None, ge=2**20)
    """KV cache size in bytes; unset, 256 MiB on a CPU and ``gpu_memory_utilization`` on a GPU."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    """On a GPU, the share of its memory this engine may take (vLLM's 0.9 unset; split it between
    the models of one GPU)."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Most sequences the engine batches at once; unset, vLLM's own default for the platform
    (as ``vllm serve``: 128 on a CPU), or for ``openai`` what the replicas report."""
    scheduler: Literal["vllm", "fair"] = "fair"
    """``"fair"`` (the default): the server's policy inside vLLM's engine loop
    (``fairagents.vllm.FairScheduler``), the arbiter handing the engine each request at once;
    ``"vllm"``: vLLM's own, behind the arbiter's admission (token budget, Statera)."""
    tool_parser: str | None = None
    """The vLLM tool parser that reads the model's tool calls (``"hermes"``, ``"llama3_json"``,
    ``"mistral"`` …); unset, inferred from the model's chat template (see
    :func:`fairagents.tools.infer_tool_parser`). Not for ``diffusion``."""
    compact_json: bool = True
    """Constrained JSON (tool calls, response formats, JSON mode) without free whitespace;
    ``false`` keeps vLLM's permissive grammar (see ``VLLMEngine(compact_json=...)``). For
    ``openai``, what the replicas were started with (``--structured-outputs-config.backend xgrammar
    --structured-outputs-config.disable_any_whitespace true``), so constraints are checked here as they run them."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Further engine arguments, passed as is: ``vllm.EngineArgs`` fields, or for ``diffusion``
    the :class:`~fairagents.engines.diffusion.DiffusionEngine` options (``max_size``, ``default_steps``…)."""

    @model_validator(mode="after")
    def _remote_needs_urls(self) -> ModelConfig:
        if (self.engine == "openai") != (self.urls is not None):
            raise ValueError("urls are for engine = \"openai\", which needs them")
        local = {"scheduler", "kv_cache_bytes", "gpu_memory_utilization"} & self.model_fields_set
        if self.engine == "openai" and local:
            raise ValueError(f"{', '.join(sorted(local))}: settings of an engine in this process, not of remote "
                             "replicas (set them on the replicas' own servers)")
        if self.engine == "diffusion" and self.tool_parser is not None:
            raise ValueError("tool_parser is for chat models; an image model calls no tools")
        if self.engine == "diffusion" and "compact_json" in self.model_fields_set:
            raise ValueError("compact_json is for chat models; an image model writes no JSON")
        if self.engine == "openai" and self.path is None and (self.d_model is None or self.n_layers is None):
            raise ValueError("engine = \"openai\" needs the model's files here (path) or its d_model and n_layers, "
                             "to price its tokens")
        return self

    def build(self, name: str = "chat") -> Any:
        """A new, unstarted engine for this model, called ``name`` in the pool (``path`` unset: the embedded model)."""
        if self.engine == "openai":
            from fairagents.engines.remote import OpenAIEngine

            given = self.d_model is not None and self.n_layers is not None
            return OpenAIEngine(
                self.urls or [], model=self.served_model_name or name, model_path=self.path,
                profile=ModelProfile(d_model=self.d_model, n_layers=self.n_layers) if given else None,  # type: ignore[arg-type]
                api_key=None if self.api_key is None else self.api_key.get_secret_value(),
                max_model_len=self.max_model_len, token_capacity=self.token_capacity,
                max_num_seqs=self.max_num_seqs,
                tool_parser=self.tool_parser, compact_json=self.compact_json, **self.engine_args,
            )
        if self.engine == "diffusion":
            from fairagents.engines.diffusion import DiffusionEngine

            return DiffusionEngine(self.path, **self.engine_args)
        from fairagents.engines.vision import VisionEngine
        from fairagents.engines.vllm import VLLMEngine

        return (VisionEngine if self.engine == "vision" else VLLMEngine)(
            self.path,
            max_model_len=self.max_model_len,
            kv_cache_bytes=self.kv_cache_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_num_seqs=self.max_num_seqs,
            scheduler=self.scheduler,
            engine_args=self.engine_args,
            tool_parser=self.tool_parser,
            compact_json=self.compact_json,
        )


class RestartConfig(_Section):
    """Automatic restart of a model whose engine died (see :class:`~fairagents.Restart`).

    Examples:
        >>> from fairagents.server.config import RestartConfig
        >>> RestartConfig().build()
        Restart(attempts=5, backoff=1.0, max_backoff=60.0)
    """

    attempts: int = Field(default=5, ge=1)
    """Starts to try before the model is left down."""
    backoff: float = Field(default=1.0, ge=0)
    """Seconds before the first start, and the first wait between failed starts (it doubles)."""
    max_backoff: float = Field(default=60.0, ge=0)
    """Longest wait between two starts."""

    def build(self) -> Restart:
        """The :class:`~fairagents.Restart` it describes."""
        return Restart(self.attempts, self.backoff, self.max_backoff)


class StateraConfig(_Section):
    """Statera admission (``[admission]``): its parameters (see :class:`~fairagents.Statera`).

    Examples:
        >>> from fairagents.server.config import StateraConfig
        >>> StateraConfig(epsilon=0.1).build().epsilon
        0.1
    """

    epsilon: float = Field(default=0.05, gt=0, lt=1)
    """Chance a request outgrows its conformal output bound."""
    frag: float = Field(default=0.05, ge=0, lt=1)
    """Share of each model's KV capacity kept free."""
    band: tuple[float, float] = (0.8, 0.95)
    """Utilisation band ``[u_low, u_high]`` the two loops keep each model in."""
    eta_budget: float = Field(default=0.5, gt=0)
    """Inner-loop step: share of the budget moved per unit of error."""
    eta_slots: float = Field(default=0.5, gt=0)
    """Outer-loop step: share of the in-flight limit moved per unit of averaged error."""
    min_budget: float = Field(default=0.1, gt=0, le=1)
    """Lowest token budget, as a share of the fenced capacity."""
    min_slots: int = Field(default=1, ge=1)
    """Lowest in-flight limit."""
    window: int = Field(default=10, ge=1)
    """Cycles the outer loop averages."""
    period: float = Field(default=0.05, gt=0)
    """Seconds per control cycle."""
    history: int = Field(default=1000, ge=1)
    """Prediction errors kept per prompt-length bucket."""

    @field_validator("band")
    @classmethod
    def _ordered_band(cls, band: tuple[float, float]) -> tuple[float, float]:
        if not 0 < band[0] <= band[1] <= 1:
            raise ValueError("band must be [u_low, u_high] with 0 < u_low ≤ u_high ≤ 1")
        return band

    def build(self) -> Statera:
        """The :class:`~fairagents.Statera` it describes."""
        return Statera(**self.model_dump())


class ImageFetchConfig(_Section):
    """Fetching image URLs for clients (``server.image_fetch``): only from ``allow_hosts``, bounded.

    Examples:
        >>> from fairagents.server import Config
        >>> config = Config.model_validate({"server": {"auth": False,
        ...                                            "image_fetch": {"allow_hosts": ["images.example.com"]}}})
        >>> config.server.image_fetch.schemes
        ['https']
    """

    allow_hosts: list[str] = Field(min_length=1)
    """Hosts images may be fetched from: ``images.example.com``, ``*.cdn.example.com``, with ``:port`` to pin one."""
    max_bytes: int = Field(default=20 * 2**20, ge=1)
    """Most bytes of one fetched image."""
    timeout: float = Field(default=10.0, gt=0)
    """Seconds for one whole fetch, connection to last byte."""
    schemes: list[Literal["https", "http"]] = Field(default_factory=lambda: ["https"], min_length=1)
    """URL schemes fetched."""
    max_images: int = Field(default=8, ge=1)
    """Most image URLs fetched for one request."""


class CountersConfig(_Section):
    """Fairness counters shared with other ``fairagents serve`` processes through Redis.

    Written ``counters = "redis://host:6379/0"`` under ``[server]``, or as a table.

    Examples:
        >>> from fairagents.server.config import CountersConfig
        >>> CountersConfig(url="redis://127.0.0.1:6379/0", namespace="prod").build().describe()
        'redis://127.0.0.1:6379/0'
    """

    url: str | None = None
    """``redis://[:password@]host:port/db``."""
    url_env: str | None = None
    """Read the URL from this environment variable instead (keeps a password out of the file)."""
    namespace: str = "default"
    """Keeps several pools apart in one Redis: the doors of one pool name the same namespace."""
    interval: float = Field(default=0.02, gt=0)
    """Seconds between syncs with Redis."""
    ttl: float = Field(default=2.0, gt=0)
    """Seconds after its last sync a door stops counting for the others."""
    timeout: float = Field(default=0.5, gt=0)
    """Seconds before Redis counts as unreachable (the door then serves on its own counters)."""
    door: str | None = None
    """This server's name among the doors (default: host, process id and a number)."""

    @model_validator(mode="after")
    def _one_url(self) -> CountersConfig:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give the Redis URL as url or url_env (one of them)")
        return self

    def build(self) -> Any:
        """The :class:`~fairagents.shared.SharedCounters` this describes."""
        from fairagents.shared import SharedCounters

        url = self.url
        if url is None:
            url = os.environ.get(self.url_env or "")
            if not url:
                raise InvalidParameterError(f"server.counters.url_env: environment variable {self.url_env!r} is not set")
        return SharedCounters(url, namespace=self.namespace, interval=self.interval, ttl=self.ttl,
                              timeout=self.timeout, door=self.door)


class LimitsConfig(_Section):
    """Bounds on a request's shape (``[server.limits]``), refused with a 400 before it is queued or charged.

    Each field is a :class:`~fairagents.limits.RequestLimits` field, with its default;
    the defaults keep stop checks cheap and any accepted grammar compile ≲ 0.4 s.

    Examples:
        >>> from fairagents.server.config import LimitsConfig
        >>> LimitsConfig(max_stop=8).build().max_stop
        8
    """

    max_stop: int = Field(default=DEFAULT_LIMITS.max_stop, ge=0)
    """Most stop strings (OpenAI's API allows 4)."""
    max_stop_chars: int = Field(default=DEFAULT_LIMITS.max_stop_chars, ge=1)
    """Longest stop string, in characters."""
    max_logit_bias: int = Field(default=DEFAULT_LIMITS.max_logit_bias, ge=0)
    """Most ``logit_bias`` entries (OpenAI's bound)."""
    max_tools: int = Field(default=DEFAULT_LIMITS.max_tools, ge=0)
    """Most tools."""
    max_constraint_bytes: int = Field(default=DEFAULT_LIMITS.max_constraint_bytes, ge=1)
    """Largest output constraint (the schema, regex or grammar; with tools, all their parameters), in bytes."""
    max_enum_values: int = Field(default=DEFAULT_LIMITS.max_enum_values, ge=0)
    """Most ``enum`` and ``const`` values (and ``choice`` items), in all."""
    max_branches: int = Field(default=DEFAULT_LIMITS.max_branches, ge=0)
    """Most ``anyOf`` and ``oneOf`` branches, in all."""
    max_properties: int = Field(default=DEFAULT_LIMITS.max_properties, ge=0)
    """Most object properties, in all."""
    max_optional_properties: int = Field(default=DEFAULT_LIMITS.max_optional_properties, ge=0)
    """Most properties of one object that are not ``required``."""
    max_depth: int = Field(default=DEFAULT_LIMITS.max_depth, ge=1)
    """Deepest nesting of subschemas."""
    max_pattern_chars: int = Field(default=DEFAULT_LIMITS.max_pattern_chars, ge=0)
    """Longest regular expression (a ``pattern``, a property-name pattern or a ``regex`` constraint), in characters."""
    max_total_pattern_chars: int = Field(default=DEFAULT_LIMITS.max_total_pattern_chars, ge=0)
    """Most characters of regular expressions, in all."""
    max_pattern_alternatives: int = Field(default=DEFAULT_LIMITS.max_pattern_alternatives, ge=0)
    """Most ``|`` alternatives in one regular expression."""
    max_repeat_product: int = Field(default=DEFAULT_LIMITS.max_repeat_product, ge=1)
    """Largest product of the bounds of nested repeats (``(a{1,50}b?){1,50}``: 2,500) in one regular expression."""

    def build(self) -> RequestLimits:
        """These bounds as the arbiter keeps them."""
        return RequestLimits(**self.model_dump())


class ServerSettings(_Section):
    """How the server listens, authenticates and shuts down.

    Examples:
        >>> from fairagents.server import Config
        >>> settings = Config.model_validate({"server": {"auth": False, "port": 9000}}).server
        >>> settings.host, settings.port
        ('127.0.0.1', 9000)
    """

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    """TCP port; 0 picks a free one."""
    auth: bool = True
    """Bearer API keys decide the app. Off (local use): the ``X-Fairagents-App`` header names it."""
    observer_key: SecretStr | None = None
    """The key of ``/metrics``, ``/v1/fairness`` and ``/dashboard`` with keys on (a bearer key, or the
    password of the browser's prompt; the dashboard also reads it from ``#key=``). Unset, they
    answer 401 but to an app's key on its own ``/v1/fairness``, unless ``public_views``."""
    drain_timeout: float = Field(default=30.0, ge=0)
    """Seconds SIGTERM waits for accepted requests before aborting the rest."""
    default_max_tokens: DefaultMaxTokens = DEFAULT_MAX_TOKENS
    """Output tokens of a request (chat or completion) that sets no ``max_tokens``, for apps
    that set none (1024 by default); ``"context"``: the rest of the context, as vLLM's
    server has it. Either way it is clipped to what fits the context and the model's token
    budget (:meth:`fairagents.Arbiter.default_max_tokens`). Each request reserves
    ``prompt + max_tokens`` of that budget while it runs, so a smaller default lets more
    such requests run at once."""
    max_queued: int | None = Field(default=256, ge=1)
    """Queue bound of apps declared on first use (keys off)."""
    max_apps: int = Field(default=64, ge=1)
    """Most apps declared on first use (keys off)."""
    image_fetch: ImageFetchConfig | None = None
    """Fetch ``http(s)`` image URLs from allowed hosts; unset (the default), images must be ``data:`` URLs."""
    preprocess_queue_per_app: int | None = Field(default=None, ge=1)
    """Most requests of one app being parsed, tokenized or having images decoded at once
    (per pool); past it, 429. Unset, an app is refused only when the pool holds 256 and
    the app an equal share of them (see :mod:`fairagents.runtime.preprocessing`)."""
    history_seconds: int = Field(default=600, ge=10)
    """How far back ``/v1/fairness`` keeps service samples for the dashboard."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    """Bounds on stop strings, logit bias, tools and output constraints (``[server.limits]``)."""
    stream_stall_timeout: float = Field(default=30.0, gt=0)
    """Seconds a response may wait on a client that does not read it. A stream is then cut
    and its request cancelled (charged only for what it produced, its slot freed); a
    connection whose last response is still unread is dropped."""
    body_timeout: float = Field(default=30.0, gt=0)
    """Seconds a client has to send a request's body once its headers are in; past it, 408."""
    header_timeout: float = Field(default=30.0, gt=0)
    """Seconds a connection has to send a request's headers (on connecting, or once a
    request's first byte is in); past it, the connection is closed."""
    # Who sees the views, and how much state names may create (docs/guides/shared-server.md).
    public_views: bool = False
    """Open ``/metrics``, ``/v1/fairness`` and ``/dashboard`` to anyone, with keys on. Off (the
    default), they need ``observer_key``; an app's own key reads its own app's ``/v1/fairness``.
    With keys off they are always open."""
    identity: list[IdentityRule] = Field(default_factory=list, max_length=32)
    """Rules that read a request's agent or run from what its client sends (``[[server.identity]]``: ``from``
    a header or a body field, ``to`` agent or run, a fixed ``value`` or a ``pattern``); see
    :mod:`fairagents.server.identity_rules` and the coding-agents guide."""
    identity_idle_seconds: float | None = Field(default=3600.0, gt=0)
    """Seconds after which an agent (or app) declared by a request, not in this configuration,
    and idle since, drops out of ``/metrics`` and ``/v1/fairness``; ``None``: never."""
    metrics_max_agents_per_app: int = Field(default=16, ge=1)
    """Agents of an app named in ``/metrics`` labels; later ones are counted as ``agent="_other"``."""
    metrics_max_apps: int = Field(default=64, ge=1)
    """Apps named in ``/metrics`` labels; later ones are counted as ``app="_other"``."""
    views_cache_seconds: float = Field(default=1.0, ge=0)
    """Seconds one build of ``/metrics`` or ``/v1/fairness`` is served to every reader."""
    counters: CountersConfig | None = None
    """Share the fairness counters (and remote replicas' slots) with other ``fairagents serve``
    processes through Redis: ``counters = "redis://host:6379/0"`` or a table; unset, this
    server keeps its own (see :mod:`fairagents.shared`)."""

    @field_validator("counters", mode="before")
    @classmethod
    def _counters_url(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value


class Config(_Section):
    """The whole configuration of ``fairagents serve``.

    Examples:
        >>> from fairagents.server import Config
        >>> try:
        ...     Config.model_validate({"apps": {"a": {}}})
        ... except ValueError as err:
        ...     print(err.errors()[0]["msg"])
        Value error, API keys are on (server.auth) but app 'a' has none: give it api_key or api_key_env, or set server.auth = false
    """

    policy: str = DEFAULT_POLICY
    """Scheduling policy: any name of :data:`fairagents.policies.POLICIES` (``hmfs_credit``, the default;
    ``hmfs``, ``vtc``, ``edf``, ``adaptive``, …), or a policy of your own as ``"module:Class"`` (or
    ``"module:factory"``), imported and built when the configuration is read (see
    :func:`fairagents.policies.make_policy`)."""
    in_flight: int | None = Field(default=None, ge=1)
    """Default in-flight limit of the models that set none."""
    pool_in_flight: int | None = Field(default=None, ge=1)
    """One in-flight limit for the whole pool, for models on shared hardware (see ``Arbiter``)."""
    token_budget: Literal["engine", "off"] | Annotated[int, Field(ge=1)] = "engine"
    """Default token budget of the models that set none: ``"engine"`` (each engine's KV
    capacity), a number of tokens, or ``"off"`` (see :mod:`fairagents.dispatcher`)."""
    max_in_flight_share: float | None = Field(default=None, gt=0, le=1)
    """Largest share of a model's slots and token budget one app may hold at once, for
    apps that set none (unset: no cap). A flooding app then cannot hold every slot."""
    admission: Literal["off", "statera"] | StateraConfig = "off"
    """``"statera"`` (or an ``[admission]`` table of its parameters): reserve a conformal
    bound on each request's output instead of ``max_tokens`` and steer each model's
    in-flight limit and token budget (H-MAS Alg. 2); ``"off"``: worst-case reservations."""
    restart: RestartConfig | Literal["off"] = Field(default_factory=lambda: RestartConfig())
    """How a model whose engine died comes back; ``"off"``: it stays down until restarted by hand."""
    d_base: int = Field(default=DEFAULT_D_BASE, ge=1, le=MAX_MODEL_WIDTH)
    w_input: float = Field(default=1.0, ge=0, le=MAX_TOKEN_PRICE)
    w_output: float = Field(default=2.0, ge=0, le=MAX_TOKEN_PRICE)
    w_cached: float = Field(default=DEFAULT_W_CACHED, ge=0, le=MAX_TOKEN_PRICE)
    """Weight of a prompt token an in-process vLLM engine reads from its prefix cache (``w_input``: charged as computed)."""
    server: ServerSettings = Field(default_factory=lambda: ServerSettings())
    models: dict[str, ModelConfig] = Field(default_factory=lambda: {"chat": ModelConfig()}, min_length=1)
    """The pool by name; by default the embedded tiny model as ``chat``."""
    apps: dict[str, AppConfig] = Field(default_factory=dict)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, policy: str) -> str:
        if ":" in policy:
            make_policy(policy)  # import and build it now: a bad one fails here, saying what failed
        elif policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(sorted(POLICIES))}")
        return policy

    @model_validator(mode="after")
    def _names_and_keys(self) -> Config:
        for name in self.models:
            check_name(name, "model")
        for name in self.apps:
            check_name(name, "app")
        if self.server.auth:
            if not self.apps:
                raise ValueError("API keys are on (server.auth) but no app is declared: add [apps.<name>] with api_key")
            owners: dict[str, str] = {}
            for name, app in self.apps.items():
                if app.api_key is None and app.api_key_env is None:
                    raise ValueError(
                        f"API keys are on (server.auth) but app {name!r} has none: "
                        "give it api_key or api_key_env, or set server.auth = false"
                    )
                key = app.api_key.get_secret_value() if app.api_key is not None else f"env:{app.api_key_env}"
                if key in owners:
                    raise ValueError(f"apps {owners[key]!r} and {name!r} have the same API key")
                owners[key] = name
        return self

    @classmethod
    def default(cls) -> Config:
        """What ``fairagents serve`` runs with no file: the embedded pool, keys off, on 127.0.0.1."""
        return cls(server=ServerSettings(auth=False))


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a ``.toml``, ``.yaml`` or ``.yml`` configuration file.

    Raises:
        InvalidParameterError: the file cannot be read or parsed, or does not validate.

    Examples:
        >>> from fairagents.server import load_config
        >>> load_config("serve.ini")
        Traceback (most recent call last):
        ...
        fairagents.errors.InvalidParameterError: serve.ini: a configuration is a .toml, .yaml or .yml file
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise InvalidParameterError(f"{path}: a configuration is a .toml, .yaml or .yml file")
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text) if suffix == ".toml" else yaml.safe_load(text)
    except (OSError, tomllib.TOMLDecodeError, yaml.YAMLError) as err:
        raise InvalidParameterError(f"{path}: {err}") from err
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidParameterError(f"{path}: the top level must be a table of settings")
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors(include_url=False)
        )
        raise InvalidParameterError(f"{path}: {problems}") from None


def build_arbiter(config: Config, engines: Mapping[str, Engine] | None = None) -> Arbiter:
    """An arbiter with the configured policy and models (engines built, not started).

    ``engines`` serves some of the configured models with engines made elsewhere, by
    model name (an engine already running, a test double). Apps and agents are declared
    by :func:`~fairagents.server.create_app`, which also serves arbiters built in code.

    Examples:
        >>> from fairagents.server import Config, build_arbiter
        >>> from fairagents.testing import FakeEngine
        >>> config = Config.model_validate({"policy": "fcfs", "server": {"auth": False}, "models": {"chat": {"in_flight": 4}}})
        >>> arbiter = build_arbiter(config, engines={"chat": FakeEngine()})
        >>> arbiter.models, arbiter.policy.name, arbiter.in_flight_limit("chat")
        (['chat'], 'fcfs', 4)
    """
    engines = dict(engines or {})
    unknown = sorted(set(engines) - set(config.models))
    if unknown:
        raise InvalidParameterError(f"engines given for models the configuration does not have: {', '.join(unknown)}")
    arbiter = Arbiter(
        policy=config.policy,
        in_flight=config.in_flight,
        pool_in_flight=config.pool_in_flight,
        token_budget=None if config.token_budget == "off" else config.token_budget,
        max_in_flight_share=config.max_in_flight_share,
        admission=config.admission.build() if isinstance(config.admission, StateraConfig) else config.admission,
        restart=None if config.restart == "off" else config.restart.build(),
        d_base=config.d_base,
        w_input=config.w_input,
        w_output=config.w_output,
        w_cached=config.w_cached,
        drain_timeout=config.server.drain_timeout,
        preprocess_queue_per_app=config.server.preprocess_queue_per_app,
        limits=config.server.limits.build(),
        counters=None if config.server.counters is None else config.server.counters.build(),
    )
    for name, model in config.models.items():
        budget = {None: False, "off": None}.get(model.token_budget, model.token_budget)  # type: ignore[arg-type]
        arbiter.add_model(name, engines.get(name) or model.build(name), in_flight=model.in_flight, token_budget=budget,
                          device=model.device)
    return arbiter
