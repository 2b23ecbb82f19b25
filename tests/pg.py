"""A throwaway PostgreSQL server for the tests that need one: a session fixture that starts a real PostgreSQL 15
with pytest-postgresql's executor on a free loopback port, and a fresh database per test (its janitor).

As root (PostgreSQL refuses to initdb or run as root) pg_ctl runs as the `postgres` system user through
tests/pg_ctl_as_postgres.sh, in a temporary directory that user owns (data, unix socket, log); as anyone else
it runs as that user. Only TCP on 127.0.0.1 is used to connect. A missing PostgreSQL fails the tests that
need it, with one message saying how to install it: it never skips them.

Use it from a test module with `from tests.pg import pg_database, pg_server  # noqa: F401` (fixtures must be in the
module's namespace), then ask for `pg_server` (a PgServer) or `pg_database` (the DSN of a fresh database).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytest_postgresql.executors import PostgreSQLExecutor
from pytest_postgresql.janitor import DatabaseJanitor

from devstack.processes import free_port, log_tail

# Where Debian's postgresql-15 puts its programs; tests/pg_ctl_as_postgres.sh reads the same variable.
PG_BIN_ENV = "TOOLLOOP_TEST_PG_BIN"
DEFAULT_PG_BIN = "/usr/lib/postgresql/15/bin"
PG_CTL_WRAPPER = Path(__file__).resolve().with_name("pg_ctl_as_postgres.sh")
INSTALL_HINT = "apt-get install -y postgresql-15"
SUPERUSER = "postgres"
HOST = "127.0.0.1"
START_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class PgServer:
    """The running server: DSNs for its databases, and fresh databases on demand."""

    host: str
    port: int
    user: str

    def dsn(self, dbname: str) -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={dbname} connect_timeout=5"

    def janitor(self, dbname: str) -> DatabaseJanitor:
        return DatabaseJanitor(user=self.user, host=self.host, port=self.port, dbname=dbname, connection_timeout=10)

    @contextmanager
    def database(self) -> Iterator[str]:
        """A new empty database for the block (dropped after it, its connections cut first); yields its DSN."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        with self.janitor(name):
            yield self.dsn(name)


def _pg_bin() -> Path:
    return Path(os.environ.get(PG_BIN_ENV) or DEFAULT_PG_BIN)


def _missing_postgres() -> str | None:
    """Why the server cannot be started here, or None."""
    pg_bin = _pg_bin()
    for program in ("pg_ctl", "initdb", "postgres"):
        if not os.access(pg_bin / program, os.X_OK):
            return f"PostgreSQL 15 is not installed ({pg_bin / program} is missing): run `{INSTALL_HINT}`"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            return (
                f"running as root, the tests start PostgreSQL as the `{SUPERUSER}` system user, which does not "
                f"exist: run `{INSTALL_HINT}` (it creates that user)"
            )
        if shutil.which("runuser") is None:
            return "running as root, the tests need `runuser` (util-linux) to start PostgreSQL as `postgres`"
    return None


def _private_dir_for_postgres() -> Path:
    """A directory under the system temp dir that the user running PostgreSQL owns (pytest's own temp dirs
    are private to root, so `postgres` could not even reach them)."""
    base = Path(tempfile.mkdtemp(prefix="toolloop-pg-")).resolve()
    (base / "socket").mkdir()
    if os.geteuid() == 0:
        owner = pwd.getpwnam(SUPERUSER)
        for path in (base, base / "socket"):
            os.chown(path, owner.pw_uid, owner.pw_gid)
    return base


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL 15 server for the whole session on a free port of 127.0.0.1; stopped at the end."""
    problem = _missing_postgres()
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    base = _private_dir_for_postgres()
    port = free_port(HOST)
    executor = PostgreSQLExecutor(
        executable=str(PG_CTL_WRAPPER),
        host=HOST,
        port=port,
        datadir=str(base / "data"),
        unixsocketdir=str(base / "socket"),
        logfile=str(base / "postgresql.log"),
        startparams="-w",
        dbname="toolloop_test",
        user=SUPERUSER,
        timeout=START_TIMEOUT_SECONDS,
        # Loopback only; a throwaway cluster needs no durability (-F already turns fsync off).
        postgres_options="-c listen_addresses=127.0.0.1 -c synchronous_commit=off -c full_page_writes=off",
    )
    try:
        executor.start()
    except Exception as exc:
        with contextlib.suppress(Exception):
            executor.stop()
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(
            f"PostgreSQL did not start on {HOST}:{port} ({type(exc).__name__}: {exc}); "
            f"log:\n{log_tail(base / 'postgresql.log')}",
            pytrace=False,
        )
    try:
        yield PgServer(host=HOST, port=port, user=SUPERUSER)
    finally:
        try:
            executor.stop()
        finally:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_database(pg_server: PgServer) -> Iterator[str]:
    """The DSN of a fresh database of its own for one test."""
    with pg_server.database() as dsn:
        yield dsn
