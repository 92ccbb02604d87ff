"""A server process on a FakeEngine, for the SIGTERM tests: prints its URL, serves until a signal.

Usage: python _serve_fake.py DRAIN_TIMEOUT TOKENS_PER_REPLY [IN_FLIGHT (default 2)] [stuck]. A token takes 10 ms.
It prints "exited" after serve() returns. With ``stuck``, a thread takes the pool's lock once the server
listens and never gives it back (a stuck engine thread): the event loop blocks on the first request.
"""

import asyncio
import sys
import threading
import time

import structlog

import fairagents as fa
from fairagents.server import Config, serve
from fairagents.testing import FakeEngine

if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout carries the URL
    drain_timeout, tokens = float(sys.argv[1]), int(sys.argv[2])
    arbiter = fa.Arbiter(in_flight=int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    arbiter.pool_policy.watchdog.deadline = 0.5  # the test waits for its report
    arbiter.add_model("chat", FakeEngine(tokens_per_reply=tokens, token_time=0.01))
    # views_cache_seconds=0: the tests watch requests come and go in /v1/fairness as they happen
    config = Config.model_validate({"server": {"auth": False, "port": 0, "drain_timeout": drain_timeout,
                                               "views_cache_seconds": 0}})
    stuck = sys.argv[4:5] == ["stuck"]

    def ready(url):
        if stuck:
            taken = threading.Event()

            def hold_forever():
                with arbiter.pool_policy.lock:
                    taken.set()
                    while True:
                        time.sleep(0.1)

            threading.Thread(target=hold_forever, name="stuck-engine", daemon=True).start()
            taken.wait()
        print(url, flush=True)

    asyncio.run(serve(arbiter, config, ready=ready))
    print("exited", flush=True)
