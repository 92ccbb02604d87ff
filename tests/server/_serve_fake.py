"""A server process on a FakeEngine, for the SIGTERM tests: prints its URL, serves until a signal.

Usage: python _serve_fake.py DRAIN_TIMEOUT TOKENS_PER_REPLY [IN_FLIGHT (default 2)]. A token takes 10 ms.
It prints "exited" after serve() returns.
"""

import asyncio
import sys

import structlog

import fairagents as fa
from fairagents.server import Config, serve
from fairagents.testing import FakeEngine

if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout carries the URL
    drain_timeout, tokens = float(sys.argv[1]), int(sys.argv[2])
    arbiter = fa.Arbiter(in_flight=int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=tokens, token_time=0.01))
    # views_cache_seconds=0: the tests watch requests come and go in /v1/fairness as they happen
    config = Config.model_validate({"server": {"auth": False, "port": 0, "drain_timeout": drain_timeout,
                                               "views_cache_seconds": 0}})
    asyncio.run(serve(arbiter, config, ready=lambda url: print(url, flush=True)))
    print("exited", flush=True)
