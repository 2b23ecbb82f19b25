"""A throwaway Redis server for the tests of the live text store: pytest-redis's process fixture starts a real
redis-server from Debian's package on a free loopback port for the session. A missing redis-server fails the
tests that need it (install it with `apt-get install -y redis-server`): they never skip.

tests/conftest.py imports both fixtures, so any test can ask for `live_text_url` (the server's redis:// URL,
its data flushed before the test)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import redis
from pytest_redis import factories
from pytest_redis.executor import RedisExecutor

INSTALL_HINT = "apt-get install -y redis-server"

redis_server = factories.redis_proc(port=None, executable=shutil.which("redis-server") or "/usr/bin/redis-server")


@pytest.fixture
def live_text_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if shutil.which("redis-server") is None:
        pytest.fail(f"redis-server is not installed: run `{INSTALL_HINT}`")
    redis_server: RedisExecutor = request.getfixturevalue("redis_server")
    url = f"redis://{redis_server.host}:{redis_server.port}/0"
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    yield url
