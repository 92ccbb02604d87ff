import socket
import time

import pytest

from fairagents.bench.scale import _wait_listening


def test_waiting_for_redis_returns_once_it_listens_and_gives_up_after_the_timeout():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        _wait_listening(port)
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="did not start") as failed:
        _wait_listening(port, timeout=0.3)
    assert isinstance(failed.value.__cause__, OSError)
    assert 0.3 <= time.monotonic() - began < 5
