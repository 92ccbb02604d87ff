import pytest

from tests._redis import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One real redis-server for the session; tests use their own namespaces."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test alone (to stop and start it)."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()
