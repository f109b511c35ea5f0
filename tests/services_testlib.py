"""The local services tests start or reach, in one place: free ports, the shared Redis
(reachable or the test fails, namespaces flushed), and private redis-server processes.

Any test folder imports it by name (`from services_testlib import free_port`): tests/ is on
the path through its conftest.py.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

REDIS_URL = "redis://127.0.0.1:6379"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def require_redis(url: str = REDIS_URL, who: str = "these tests") -> str:
    """Fail (never skip) when Redis is not there: the tests that call this exist to run
    against it."""
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.exceptions.ConnectionError, OSError) as exc:
        pytest.fail(
            f"Redis is not reachable at {url} ({exc}). {who} run against a real "
            "redis-server: start one (.ci/run does) and run them again."
        )
    finally:
        client.close()
    return url


def flush_namespace(namespace: str, url: str = REDIS_URL) -> None:
    """Delete every key of one namespace (a test's own) from the shared Redis."""
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{namespace}:*"))
    if keys:
        client.delete(*keys)
    client.close()


class PrivateRedis:
    """A redis-server of the test's own on a free port, which it may stop and start again.

    No automatic snapshots: a restart comes back empty, unless `save()` wrote a snapshot
    first into `workdir` (then it comes back with the data it had). With `appendfsync`
    ("always", "everysec" or "no") it runs with the AOF on instead, and a restart (even
    after SIGKILL) replays it. `options` are more redis-server arguments (e.g. renaming
    CONFIG away). Without a `workdir` it writes no files.
    """

    def __init__(
        self, workdir: Path | None = None, appendfsync: str | None = None, options: tuple = ()
    ):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.fail("redis-server is not on PATH: install it (.ci/run does) to run this test")
        self.port = free_port()
        self.dir = workdir
        self.process: subprocess.Popen | None = None
        aof = ["--appendonly", "no"]
        if appendfsync is not None:
            aof = ["--appendonly", "yes", "--appendfsync", appendfsync]
        files = ["--dir", str(workdir), "--dbfilename", "dump.rdb"] if workdir else []
        self.persistence = [*aof, *options, *files]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> PrivateRedis:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + self.persistence,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
                client.ping()
                client.close()
                return self
            except (redis.exceptions.ConnectionError, OSError):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise AssertionError("the private redis-server did not start") from None
                time.sleep(0.05)

    def save(self) -> None:
        client = redis.Redis(port=self.port)
        client.save()
        client.close()

    def stop(self) -> None:
        """Stop as asked (SIGTERM)."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None

    def kill(self) -> None:
        """Stop at once (SIGKILL): no snapshot is written."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def forget_snapshot(self) -> None:
        (self.dir / "dump.rdb").unlink(missing_ok=True)
