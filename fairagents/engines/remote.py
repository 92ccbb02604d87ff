"""A model served by remote OpenAI-compatible servers: one or more ``vllm serve`` replicas behind one name.

:class:`OpenAIEngine` is an :class:`~fairagents.engines.Engine` whose requests run on
other machines, through the ``openai`` client:

- **Dispatch.** Each request goes to the healthy replica with the fewest requests of
  this engine in flight (least loaded), as a streaming ``/v1/completions`` call on the
  prompt's token ids, with ``stream_options`` asking for usage on every chunk, so the
  tokens charged are the server's own count.
- **Identity** travels as vLLM's ``vllm_xargs`` (``fairagents_app``,
  ``fairagents_agent`` and their weights, and ``fairagents_run`` for a request of a run): a replica running
  :class:`~fairagents.vllm.FairScheduler` schedules by it.
- **Pricing before dispatch.** Prompts are tokenized before they are queued, so they
  can be priced: with the model's tokenizer from its files when they are here
  (``model_path``; also the source of its profile for unified tokens), else by the
  replica's ``/tokenize``.
- **Abort** closes the stream: vLLM aborts a request whose client disconnected.
- **Capacity.** ``token_capacity`` (the default token budget: the KV tokens of all
  replicas) is configured, or read from each replica's ``/metrics``
  (``vllm:cache_config_info``); ``max_num_seqs`` (the default in-flight limit) is
  configured per replica and summed.
- **A replica that fails** (connection refused or reset, a 5xx, a failed health check)
  is taken out; it is checked again (``/health``) with exponential backoff (tenacity)
  and put back when it answers. Of the requests it held, one that had produced no
  token yet is sent again to another healthy replica (as if it had waited); one that
  had fails with :class:`~fairagents.EngineError` (sending it again would repeat its
  output). The engine stays ``healthy`` while one replica is; with none left it is
  dead, and the arbiter's restart brings it back when one answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import os
import re
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import tenacity

from fairagents._logging import get_logger
from fairagents.cost import ModelProfile
from fairagents.engines.base import COMPACT_JSON, Delta, EngineBase, GenerationParams, Prompt
from fairagents.errors import EngineError, InvalidParameterError
from fairagents.identity import Modality, identity_args
from fairagents.models import LOAD_LOCK
from fairagents.engines.prompts import render_chat
from fairagents.reply import TokenLogprob
from fairagents.tools import OutputSpec, check_tool_parser, infer_tool_parser, tool_parser_for

__all__ = ["OpenAIEngine", "Replica"]

log = get_logger("fairagents.engines.remote")

#: Server errors (5xx) in a row after which a replica is taken out (one bad request must not empty the pool).
STRIKES = 3

_CACHE_INFO = re.compile(r'^vllm:cache_config_info\{(?P<labels>[^}]*)\}', re.M)


@dataclass(eq=False)
class Replica:
    """One server of the model, and what this engine knows of it.

    Examples:
        >>> from fairagents.engines.remote import Replica
        >>> Replica("http://127.0.0.1:8000/v1").root
        'http://127.0.0.1:8000'
    """

    url: str
    """Its OpenAI base URL (``…/v1``)."""
    healthy: bool = True
    running: int = 0
    """Requests of this engine in flight on it."""
    served: int = 0
    """Requests it has been sent."""
    failures: int = 0
    """Times it was taken out."""
    strikes: int = 0
    """Server errors (5xx) in a row; at :data:`STRIKES` it is taken out."""
    client: Any = field(default=None, repr=False)
    recheck: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def root(self) -> str:
        """The server's root URL (its base URL without ``/v1``), where ``/health`` and ``/metrics`` live."""
        return self.url.rstrip("/").removesuffix("/v1")


class _ReplicaFailed(Exception):
    """A replica failed (connection, 5xx) — before or after the request produced output."""


class OpenAIEngine(EngineBase):
    """A text model on one or more remote OpenAI-compatible (vLLM) servers (see the module docs).

    Args:
        urls: the replicas' OpenAI base URLs (``http://host:port/v1``).
        model: the model's name on the servers (``--served-model-name``).
        model_path: the model's files here (a folder or a Hugging Face name): its
            tokenizer prices prompts locally and its config gives the profile.
        profile: the model's profile for unified tokens, when its files are not here.
        api_key: the servers' API key, if they need one.
        max_model_len: the context length; unset, the servers' own.
        token_capacity: KV tokens of all replicas together; unset, read from their ``/metrics``.
        max_num_seqs: sequences one replica batches at once (the in-flight limit is this
            times the replicas); unset, the arbiter's default.
        timeout: seconds a request may take in all.
        backoff: seconds before the first health check of a failed replica (it doubles).
        max_backoff: longest wait between two health checks.
        transport: a scripted ``httpx.MockTransport`` that answers every call to the servers, sync and
            async (tests).
        tool_parser: the vLLM tool parser that reads the model's calls here (``tool_choice="auto"``);
            unset, inferred from the chat template in ``model_path`` (see ``VLLMEngine``).
        compact_json: the replicas write compact constrained JSON, started with
            ``--structured-outputs-config.backend xgrammar
            --structured-outputs-config.disable_any_whitespace true`` (as in-process engines
            write it): constraints are checked here as they run them, with xgrammar alone.
            ``False``: replicas on vLLM's default ``auto`` backend (xgrammar, falling back
            to guidance). The replicas' whitespace is theirs to set; this says what they run.

    Examples:
        >>> import fairagents as fa
        >>> from fairagents.engines.remote import OpenAIEngine
        >>> engine = OpenAIEngine(["http://127.0.0.1:8000/v1"], model="chat",
        ...                       profile=fa.ModelProfile(d_model=4096, n_layers=32))
        >>> engine.healthy, [r.url for r in engine.replicas]
        (True, ['http://127.0.0.1:8000/v1'])
    """

    modality: Modality = Modality.TEXT
    shared_capacity = True  # other arbiters may send to the same replicas
    structured_outputs = True  # passed to the replicas (vLLM's structured outputs)

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str,
        model_path: str | os.PathLike[str] | None = None,
        profile: ModelProfile | None = None,
        api_key: str | None = None,
        max_model_len: int | None = None,
        token_capacity: int | None = None,
        max_num_seqs: int | None = None,
        timeout: float = 600.0,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        transport: httpx.MockTransport | None = None,
        tool_parser: str | None = None,
        compact_json: bool = True,
    ) -> None:
        if not isinstance(compact_json, bool):
            raise InvalidParameterError(f"compact_json must be true or false, got {compact_json!r}")
        if isinstance(urls, str) or not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://"))
                                                        for u in urls):
            raise InvalidParameterError(f"urls must be a non-empty list of http(s) base URLs, got {urls!r}")
        if model_path is None and profile is None:
            raise InvalidParameterError("an OpenAIEngine needs the model's files (model_path) or its profile "
                                        "(profile), to price its tokens")
        self.replicas = [Replica(u.rstrip("/")) for u in urls]
        self.model = model
        self.compact_json = compact_json
        """The replicas write compact constrained JSON (with xgrammar alone); see the ``compact_json`` argument."""
        self.tool_parser_name = None if tool_parser is None else check_tool_parser(tool_parser)
        """The vLLM tool parser of the model's calls (inferred on :meth:`start` when not given)."""
        self.model_path = None if model_path is None else str(model_path)
        self.profile = profile or ModelProfile(d_model=1, n_layers=1)  # from the model's config on start()
        self._given_profile = profile is not None
        self.api_key = api_key
        self.max_model_len = max_model_len or 0
        self._given_capacity = token_capacity
        self.token_capacity: int | None = token_capacity
        self._per_replica_seqs = max_num_seqs
        self.max_num_seqs = None if max_num_seqs is None else max_num_seqs * len(self.replicas)
        self.timeout, self.backoff, self.max_backoff = timeout, backoff, max_backoff
        self._transport = transport
        self._closed = False
        self._logits_vocab: int | None = None  # the model config's vocab_size: the replicas' bound on token ids
        self._tokenizer: Any = None
        self._streams: dict[str, Any] = {}  # request id -> its open stream (to abort it)
        self._aborted: set[str] = set()
        self._inflight: set[str] = set()
        self._started = False

    @property
    def healthy(self) -> bool:
        """Whether one replica at least is in service."""
        return any(r.healthy for r in self.replicas)

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Reach the replicas (at least one must answer), learn the context and capacity, load the tokenizer."""
        if self._started and self.healthy:
            return
        import openai

        self._closed = False
        for r in self.replicas:
            if r.client is None:
                r.client = openai.AsyncOpenAI(base_url=r.url, api_key=self.api_key or "unused", max_retries=0,
                                              timeout=self.timeout, http_client=self._http())
        results = await asyncio.gather(*(self._probe(r) for r in self.replicas), return_exceptions=True)
        cards = [c for c in results if not isinstance(c, BaseException)]
        for r, result in zip(self.replicas, results, strict=True):
            r.healthy = not isinstance(result, BaseException)
            if not r.healthy:
                self._take_out(r, result)  # type: ignore[arg-type]
        if not cards:
            raise EngineError(f"no replica of model {self.model!r} answers: {results[0]}")
        if not self.max_model_len:
            lengths = [c["max_model_len"] for c in cards if c.get("max_model_len")]
            if not lengths:
                raise EngineError(f"the replicas of {self.model!r} do not say their context length: set max_model_len")
            self.max_model_len = min(lengths)
        if self._given_capacity is None:
            capacities = await asyncio.gather(*(self._capacity(r) for r in self.replicas if r.healthy))
            self.token_capacity = sum(capacities) if capacities and all(capacities) else None
        if self.model_path is not None and self._tokenizer is None:
            self._tokenizer, profile, self._logits_vocab = await asyncio.to_thread(_load_tokenizer, self.model_path)
            if not self._given_profile:
                self.profile = profile
            self.vocab_size = len(self._tokenizer)
            if self.tool_parser_name is None:
                self.tool_parser_name = infer_tool_parser(getattr(self._tokenizer, "chat_template", None))
        self._started = True

    async def stop(self) -> None:
        """Stop checking replicas and close the connections."""
        self._closed = True
        for r in self.replicas:
            if r.recheck is not None:
                r.recheck.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await r.recheck
                r.recheck = None
            if r.client is not None:
                await r.client.close()
                r.client = None
        self._started = False

    async def _probe(self, r: Replica) -> dict[str, Any]:
        """The replica's card for this model (raises if it is down or does not serve it)."""
        if r.client is None:
            raise EngineError("the engine is stopped")
        page = await r.client.models.list()
        for card in page.data:
            if card.id == self.model:
                return card.model_dump()
        raise EngineError(f"replica {r.url} does not serve {self.model!r} (it serves {[c.id for c in page.data]})")

    async def _capacity(self, r: Replica) -> int | None:
        """KV tokens the replica holds, from its ``/metrics`` (``None`` if it does not say)."""
        try:
            async with self._http(10) as http:
                text = (await http.get(f"{r.root}/metrics")).text
        except httpx.HTTPError:
            return None
        found = _CACHE_INFO.search(text)
        if found is None:
            return None
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found["labels"]))
        try:
            return (int(labels["num_gpu_blocks"]) - 1) * int(labels["block_size"])  # vLLM keeps one null block
        except (KeyError, ValueError):
            return None

    def _http(self, timeout: float | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=self._transport, timeout=timeout or self.timeout)  # type: ignore[arg-type]

    # -- replicas in and out --------------------------------------------------------

    def _take_out(self, r: Replica, err: BaseException) -> None:
        if self._closed or (r.recheck is not None and not r.recheck.done()):
            return
        r.healthy = False
        r.failures += 1
        log.warning("fairagents.remote.replica_down", url=r.url, model=self.model, error=str(err))
        r.recheck = asyncio.get_running_loop().create_task(self._recheck(r))

    async def _recheck(self, r: Replica) -> None:
        """Check ``r``'s ``/health`` with exponential backoff until it answers; then put it back."""
        retrying = tenacity.AsyncRetrying(
            wait=tenacity.wait_exponential(multiplier=self.backoff, max=self.max_backoff),
            retry=tenacity.retry_if_exception_type(Exception), before=_sleep_first(self.backoff),
        )
        async for attempt in retrying:
            with attempt:
                if self._closed:
                    return  # the engine stopped: nothing to put back
                async with self._http(5) as http:
                    (await http.get(f"{r.root}/health")).raise_for_status()
                await self._probe(r)
        r.healthy = True
        r.strikes = 0
        log.info("fairagents.remote.replica_back", url=r.url, model=self.model)

    def _pick(self, tried: set[int]) -> Replica | None:
        candidates = [r for r in self.replicas if r.healthy and id(r) not in tried and r.client is not None]
        return min(candidates, key=lambda r: r.running) if candidates else None

    # -- prompts -----------------------------------------------------------------

    def check_params(self, params: GenerationParams) -> None:
        """Refuse, before queueing, parameters a vLLM replica would reject, checked here (no network, no GPU).

        The arbiter calls this off the event loop before a call is queued, so a bad
        request is refused with a typed error and costs nothing. Checked:

        - ``logit_bias``: a token id outside ``[0, vocab_size)`` is refused with vLLM's
          message, when the vocabulary size is known here (the model config's
          ``vocab_size``, vLLM's bound, from ``model_path``; else :attr:`vocab_size`).
        - the other sampling parameters, by building vLLM's ``SamplingParams`` from them
          as a replica builds it from the request (its own argument checks).
        - ``structured`` (the output constraint) as vLLM's engine checks it before it
          accepts a request (``SamplingParams.verify``, and the server's check of a
          structural tag) under the replicas' backend: xgrammar alone with
          ``compact_json`` (the default), else ``"auto"``, xgrammar falling back to
          guidance (or outlines) for what xgrammar does not support, so a constraint a
          replica accepts is not refused. The grammars are only parsed, never compiled
          against a vocabulary: the check needs no tokenizer (the model's own, when its
          files are here, decides only whether guidance can serve it).

        The first check imports vLLM (seconds, once per process). When vLLM cannot be
        imported here, only ``logit_bias`` is checked (without xgrammar, all but the
        constraint): a replica then refuses the rest after dispatch (``generate`` raises
        ``InvalidParameterError``), once the call was scheduled and charged for its
        prompt. Bounds known only to the replica (its ``--max-logprobs``, a vocabulary
        not known here) are left to it.

        Raises:
            InvalidParameterError: what a replica would reject, naming the parameter.

        Examples:
            >>> import fairagents as fa
            >>> from fairagents.engines import GenerationParams
            >>> from fairagents.engines.remote import OpenAIEngine
            >>> engine = OpenAIEngine(["http://127.0.0.1:8000/v1"], model="chat",
            ...                       profile=fa.ModelProfile(d_model=4096, n_layers=32))
            >>> engine.check_params(GenerationParams(max_tokens=8, structured={"json": {"type": "object"}}))
            >>> try:
            ...     engine.check_params(GenerationParams(max_tokens=8, structured={"json": {"type": "nope"}}))
            ... except fa.InvalidParameterError as err:
            ...     print(str(err).split(": ")[0], "/", str(err).rsplit(": ", 1)[-1].strip())
            the model's servers would reject the output constraint (structured outputs, json) / Unsupported type "nope"
        """
        vocab = self._logits_vocab or self.vocab_size
        if params.logit_bias and vocab:
            invalid = [token for token, _ in params.logit_bias if not 0 <= token < vocab]
            if invalid:  # as vLLM's SamplingParams._validate_logit_bias says it
                raise InvalidParameterError(
                    f"the model's servers would reject logit_bias: token_id(s) {invalid} in logit_bias contain "
                    f"out-of-vocab token ids. Vocabulary size: {vocab}")
        checks = _vllm_checks()
        if checks is None:
            return
        try:
            self._check_with_vllm(checks, params, vocab)
        except InvalidParameterError:
            raise
        except Exception as err:  # noqa: BLE001 - not the request's fault (no xgrammar, another vLLM)
            log.warning("fairagents.remote.params_unchecked", model=self.model, error=repr(err))  # the replica checks

    def _check_with_vllm(self, checks: _VLLMChecks, params: GenerationParams, vocab: int | None) -> None:
        """vLLM's checks of ``params`` as a replica runs them on the request ``generate`` sends."""
        structured, bad_constraint = None, ""
        if params.structured is not None:
            given = [k for k in _CONSTRAINTS
                     if isinstance(params.structured, dict) and params.structured.get(k) is not None]
            bad_constraint = (f"the model's servers would reject the output constraint "
                              f"(structured outputs, {', '.join(given) or 'none given'})")
            try:  # a copy: vLLM's checks may rewrite it (a choice becomes a grammar)
                structured = checks.StructuredOutputsParams(**copy.deepcopy(params.structured))
            except (checks.ClientError, ValueError, TypeError) as err:  # the request's fault, as vLLM's server says
                raise InvalidParameterError(f"{bad_constraint}: {err}") from err
        try:  # as the OpenAI server builds it from the request (its own argument checks)
            sampling = checks.build_sampling_params(
                **params.sampling_fields(), structured_outputs=structured,
                logit_bias={str(token): bias for token, bias in params.logit_bias} or None,  # as generate sends it
            )
            # No structured-outputs config: all but the constraint (log probabilities against the vocabulary).
            sampling.verify(_ReplicaConfig(vocab, self.max_model_len), None, None, None)
        except (checks.ClientError, ValueError) as err:
            raise InvalidParameterError(f"the model's servers would reject the request's parameters: {err}") from err
        if structured is None:
            return
        tokenizer = self._tokenizer if self._tokenizer is not None else _any_fast_tokenizer()
        if tokenizer is None:
            return  # vLLM's backend choice needs one; none could be made here: the replica checks
        try:
            if structured.structural_tag is not None and checks.check_structural_tag is not None:
                checks.check_structural_tag(structured)  # the OpenAI server's own check (xgrammar alone)
            backend = checks.StructuredOutputsConfig(**COMPACT_JSON) if self.compact_json else \
                checks.StructuredOutputsConfig(backend="auto")
            sampling.verify(_ReplicaConfig(vocab, self.max_model_len), None, backend, tokenizer)
        except (checks.ClientError, ValueError) as err:
            raise InvalidParameterError(f"{bad_constraint}: {err}") from err

    def prepare_chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> Prompt:
        """Apply the chat template (with ``tools``) and tokenize (locally, or by a replica's ``/tokenize``)."""
        for i, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
                raise InvalidParameterError(f"messages[{i}].content must be text for a text model",
                                            param=f"messages[{i}].content")
        if self._tokenizer is not None:
            return Prompt(token_ids=tuple(render_chat(self._tokenizer, messages, tools)))
        body: dict[str, Any] = {"messages": [dict(m) for m in messages], "add_generation_prompt": True}  # OpenAI's form
        if tools:
            body["tools"] = list(tools)
        ids = self._tokenize(body)
        if not ids:
            raise InvalidParameterError("the messages render to an empty prompt")
        return Prompt(token_ids=tuple(ids))

    def tool_parser(self, spec: OutputSpec) -> Any:
        """vLLM's tool parser of this model (from its local files), for one call's tools.

        Tool calls are read here, where the prompt was rendered; the replica only
        generates (and enforces a required call's JSON).
        """
        if self._tokenizer is None:
            raise InvalidParameterError(
                f"tool_choice 'auto' on {self.model!r} needs the model's files here to read its calls: give path=")
        if self.tool_parser_name is None:
            raise InvalidParameterError(f"no tool parser is known for model {self.model!r}: give tool_parser=")
        return tool_parser_for(self.tool_parser_name, self._tokenizer, spec)

    def prepare_text(self, text: str) -> Prompt:
        """Tokenize a plain prompt as the model reads it."""
        if not isinstance(text, str) or not text:
            raise InvalidParameterError(f"the prompt must be a non-empty string, got {text!r}")
        ids = self._tokenizer.encode(text) if self._tokenizer is not None else self._tokenize({"prompt": text})
        return Prompt(token_ids=tuple(ids))

    def _tokenize(self, body: dict[str, Any]) -> list[int]:
        """A replica's ``/tokenize`` (runs in a preprocessing thread: a blocking call is fine there)."""
        for r in [r for r in self.replicas if r.healthy] or self.replicas:
            try:
                with httpx.Client(transport=self._transport, timeout=30) as http:  # type: ignore[arg-type]
                    reply = http.post(f"{r.root}/tokenize", json={"model": self.model, **body})
            except httpx.HTTPError:
                continue
            if reply.status_code == 400:
                raise InvalidParameterError(f"the model's server rejected the prompt: {reply.text[:500]}")
            if reply.status_code == 200:
                return list(reply.json()["tokens"])
        raise EngineError(f"no replica of {self.model!r} could tokenize the prompt")

    # -- requests ----------------------------------------------------------------

    async def generate(self, request_id: str, prompt: Prompt, params: GenerationParams) -> AsyncIterator[Delta]:
        """Stream one request from the least-loaded replica (see the module docs for failures)."""
        tried: set[int] = set()
        self._inflight.add(request_id)
        try:
            async with contextlib.aclosing(self._generate(request_id, prompt, params, tried)) as deltas:
                async for delta in deltas:
                    yield delta
        finally:
            self._inflight.discard(request_id)
            self._aborted.discard(request_id)

    async def _generate(self, request_id: str, prompt: Prompt, params: GenerationParams,
                        tried: set[int]) -> AsyncIterator[Delta]:
        while True:
            r = self._pick(tried)
            if r is None:
                raise EngineError(f"no replica of {self.model!r} is in service")
            tried.add(id(r))
            produced = 0
            try:
                async with contextlib.aclosing(self._stream(r, request_id, prompt, params)) as deltas:
                    async for delta in deltas:  # closed with this generator: the replica then aborts
                        produced += delta.new_tokens or bool(delta.text)
                        yield delta
                return
            except _ReplicaFailed as failed:
                self._take_out(r, failed.__cause__ or failed)
                if produced:
                    raise EngineError(f"replica {r.url} of {self.model!r} failed mid-request: {failed.__cause__}") \
                        from failed.__cause__
                log.info("fairagents.remote.retry_elsewhere", request_id=request_id, model=self.model)

    async def _stream(self, r: Replica, request_id: str, prompt: Prompt,
                      params: GenerationParams) -> AsyncIterator[Delta]:
        import openai

        extra: dict[str, Any] = {"ignore_eos": params.ignore_eos}
        if params.logit_bias:
            extra["logit_bias"] = {str(token): bias for token, bias in params.logit_bias}
        if params.structured is not None:
            extra["structured_outputs"] = params.structured
        if not params.skip_special_tokens:
            extra["skip_special_tokens"] = False
        if params.repetition_penalty != 1.0:
            extra["repetition_penalty"] = params.repetition_penalty
        if params.top_k:
            extra["top_k"] = params.top_k
        if params.agent is not None:
            extra["vllm_xargs"] = identity_args(params.agent, params.run)
        r.running += 1
        r.served += 1
        stream = None
        try:
            try:
                stream = await r.client.completions.create(
                    model=self.model, prompt=list(prompt.token_ids), max_tokens=params.max_tokens,
                    temperature=params.temperature, top_p=params.top_p, seed=params.seed,
                    stop=list(params.stop) or None, stream=True, logprobs=params.logprobs,
                    presence_penalty=params.presence_penalty, frequency_penalty=params.frequency_penalty,
                    stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body=extra,
                )
            except openai.APITimeoutError as err:  # a slow request, not a dead replica
                raise EngineError(f"replica {r.url} of {self.model!r} did not answer in {self.timeout:g} s") from err
            except openai.APIConnectionError as err:  # refused, reset: the replica is gone
                raise _ReplicaFailed(str(err)) from err
            except openai.InternalServerError as err:  # may be this request's fault: strikes, not out at once
                r.strikes += 1
                if r.strikes >= STRIKES:
                    raise _ReplicaFailed(str(err)) from err
                raise EngineError(f"replica {r.url} of {self.model!r} answered {err.status_code}: {err.message}") \
                    from err
            except openai.BadRequestError as err:
                raise InvalidParameterError(f"the model's server rejected the request: {err.message}") from err
            except openai.APIStatusError as err:
                raise EngineError(f"the model's server answered {err.status_code}: {err.message}") from err
            r.strikes = 0
            self._streams[request_id] = stream
            if request_id in self._aborted:  # aborted while the request was being sent
                yield Delta(0, "", "abort")
                return
            produced, finish, counted = 0, None, True
            try:
                async for chunk in stream:
                    if request_id in self._aborted:
                        break
                    text, new, logprobs = "", 0, ()
                    if chunk.choices:
                        text = chunk.choices[0].text or ""
                        finish = chunk.choices[0].finish_reason or finish
                        got = chunk.choices[0].logprobs
                        if params.logprobs is not None and got is not None and got.tokens:
                            values = got.token_logprobs or []
                            tops = got.top_logprobs or []
                            logprobs = tuple(
                                TokenLogprob(
                                    token, float("-inf") if i >= len(values) or values[i] is None else values[i],
                                    tuple(TokenLogprob(t, v) for t, v in sorted(
                                        (tops[i] if i < len(tops) and tops[i] else {}).items(),
                                        key=lambda item: -item[1])[:params.logprobs]),
                                ) for i, token in enumerate(got.tokens))
                    if chunk.usage is not None:
                        new = max(chunk.usage.completion_tokens - produced, 0)
                        produced = chunk.usage.completion_tokens
                    elif text:  # a server without per-chunk usage: a chunk per token, set right by the last usage
                        new, counted = 1, False
                        produced += 1
                    if new or text:
                        yield Delta(new, text, logprobs=logprobs)
            except (openai.APIConnectionError, httpx.TransportError, httpx.StreamError) as err:
                if request_id in self._aborted:
                    finish = "abort"
                else:
                    raise _ReplicaFailed(str(err)) from err
            if request_id in self._aborted:
                finish = "abort"
            elif finish is None:  # the stream ended without saying why: cut off, not finished
                raise _ReplicaFailed("the stream ended without a finish reason")
            if not counted:
                log.warning("fairagents.remote.no_usage_per_chunk", url=r.url, model=self.model)
            yield Delta(0, "", finish)
        finally:
            r.running -= 1
            self._streams.pop(request_id, None)
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.close()  # an early close is how vLLM learns to abort

    async def abort(self, request_id: str) -> None:
        """End a running request: its stream closes, and the replica aborts it."""
        if request_id not in self._inflight:
            return
        self._aborted.add(request_id)  # also heard by a request still being sent
        stream = self._streams.get(request_id)
        if stream is not None:
            await stream.close()


def _sleep_first(seconds: float) -> Any:
    """A tenacity ``before`` hook that waits before the first attempt too (a replica just failed)."""

    async def before(state: tenacity.RetryCallState) -> None:
        if state.attempt_number == 1:
            await asyncio.sleep(seconds)

    return before


def _load_tokenizer(path: str) -> tuple[Any, ModelProfile, int | None]:
    """The model's tokenizer, profile and config vocabulary size (vLLM's ``get_vocab_size``), from its files."""
    from transformers import AutoConfig, AutoTokenizer

    with LOAD_LOCK:
        tokenizer = AutoTokenizer.from_pretrained(path)
        config = AutoConfig.from_pretrained(path)
    text_config = config.get_text_config()
    vocab = getattr(text_config, "vocab_size", None)
    return tokenizer, ModelProfile.of_text_config(text_config), vocab if isinstance(vocab, int) and vocab > 0 else None


#: The constraint fields of vLLM's ``StructuredOutputsParams`` (one of them is set).
_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class _ReplicaConfig:
    """What vLLM's ``SamplingParams.verify`` reads of a replica's model config, as far as it is known here.

    A bound not known here is left to the replica: without the vocabulary size none on
    token ids; its ``--max-logprobs`` (-1 here: the vocabulary bounds log probabilities).
    """

    is_diffusion = False
    max_logprobs = -1

    def __init__(self, vocab_size: int | None, max_model_len: int) -> None:
        self.vocab_size = vocab_size or sys.maxsize
        self.max_model_len = max_model_len or sys.maxsize

    def get_vocab_size(self) -> int:
        return self.vocab_size


@dataclass(frozen=True)
class _VLLMChecks:
    """vLLM's request checks (what :meth:`OpenAIEngine.check_params` runs)."""

    build_sampling_params: Any  # SamplingParams.from_optional: how the OpenAI server builds them
    StructuredOutputsParams: Any
    StructuredOutputsConfig: Any
    ClientError: type[Exception]
    check_structural_tag: Any  # the OpenAI server's check of a structural tag (None if this vLLM has none)


@functools.cache
def _vllm_checks() -> _VLLMChecks | None:
    """vLLM's request checks, imported once; ``None`` when vLLM cannot be imported here."""
    try:
        from vllm.config import StructuredOutputsConfig
        from vllm.exceptions import VLLMClientError
        from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    except Exception as err:  # noqa: BLE001 - not installed (or not importable here): the replicas check
        log.info("fairagents.remote.no_local_vllm", error=repr(err))
        return None
    try:
        from vllm.entrypoints.generate.base.protocol import validate_structured_outputs_structural_tag
    except Exception:  # noqa: BLE001 - another vLLM: the engine's check of a structural tag remains
        validate_structured_outputs_structural_tag = None
    build = getattr(SamplingParams, "from_optional", SamplingParams)
    return _VLLMChecks(build, StructuredOutputsParams, StructuredOutputsConfig, VLLMClientError,
                       validate_structured_outputs_structural_tag)


@functools.cache
def _any_fast_tokenizer() -> Any:
    """A one-token fast tokenizer: what vLLM's backend choice needs when the model's own is not here.

    vLLM's ``"auto"`` backend asks of the tokenizer only whether it is a fast Hugging Face
    one (guidance serves only those) or Mistral's: a replica's usual tokenizer is the first.
    """
    try:
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")))
    except Exception as err:  # noqa: BLE001 - no tokenizers here: the replicas check the constraint
        log.info("fairagents.remote.no_local_tokenizer", error=repr(err))
        return None
