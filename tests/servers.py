"""Real PostgreSQL, MariaDB and RabbitMQ servers for the tests: a pytest plugin.

Loaded by ``tests/conftest.py`` with ``pytest_plugins = ("tests.servers",)``.

Session-scoped fixtures:

* ``txtasks_servers``: the :class:`Servers` found or started (their own URLs, shared by every
  pytest process of the run: a test that needs a server to itself starts a private one).
* ``postgres_url``, ``mysql_url``, ``amqp_url``: this pytest process's own database or virtual
  host on that server (``tests/isolation.py``), e.g.
  ``postgresql://app:app@127.0.0.1:PORT/txt_<run>_gw0``. When that server is not available the
  test is skipped, or fails when the environment variable ``CI`` is ``true`` or ``1``.
* ``pgbouncer_url``: the same PostgreSQL database as ``postgres_url``, through PgBouncer in
  transaction pooling mode (``?pooler=transaction``); skipped (failed in CI) likewise.

The servers come from the first of these that applies:

1. ``TXTASKS_TEST_SERVICES_ENV``: the ``services.env`` of servers started by ``tests/run.sh``
   (written by ``tests/services.sh``); they are used as they are.
2. ``TXTASKS_TEST_POSTGRES_URL``, ``TXTASKS_TEST_MYSQL_URL``, ``TXTASKS_TEST_AMQP_URL``,
   ``TXTASKS_TEST_PGBOUNCER_URL`` (a PgBouncer in transaction mode in front of the first, its
   databases and user): servers you run yourself. Setting any of them selects this; the ones
   left unset count as not available.
3. A reachable Docker engine (not with ``TXTASKS_TEST_DOCKER=0``): testcontainers with
   ``postgres:15``, ``mariadb:10.11`` and ``rabbitmq:3.10`` (no PgBouncer); if they fail to
   start (say the images cannot be pulled), 4. is tried.
4. The Debian server binaries (``bash tests/install-deps.sh`` installs them): private servers
   started by ``tests/services.sh`` (or ``TXTASKS_TEST_SERVICES_SH``) on free ports in a new
   directory under /tmp.
5. Otherwise none.

Servers started here (3 and 4) are started only when a test asks for them, and stopped at the end
of the session, also after Ctrl-C or SIGTERM. ``PG_FAST=0`` gives PostgreSQL its durable defaults
(fsync on), as ``tests/services.sh`` does.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import glob
import importlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests import isolation
from tests.waiting import until_sync

KINDS = ("postgresql", "pgbouncer", "mysql", "amqp")
LABELS = {
    "postgresql": "PostgreSQL",
    "pgbouncer": "PgBouncer",
    "mysql": "MariaDB/MySQL",
    "amqp": "RabbitMQ",
}
URL_VARS = {
    "postgresql": "TXTASKS_TEST_POSTGRES_URL",
    "pgbouncer": "TXTASKS_TEST_PGBOUNCER_URL",
    "mysql": "TXTASKS_TEST_MYSQL_URL",
    "amqp": "TXTASKS_TEST_AMQP_URL",
}
SERVICES_ENV_VAR = "TXTASKS_TEST_SERVICES_ENV"
SERVICES_SH = Path(__file__).with_name("services.sh")
DB, USER, PASSWORD = "appdb", "app", "app"

# services.env key and tests/services.sh name of each kind
_ENV_KEYS = {
    "postgresql": "PG_DSN",
    "pgbouncer": "PGB_DSN",
    "mysql": "MYSQL_DSN",
    "amqp": "AMQP_URL",
}
_SH_NAMES = {"postgresql": "pg", "pgbouncer": "pgbouncer", "mysql": "mariadb", "amqp": "rabbitmq"}
_START_ATTEMPTS = 3  # a port picked as free can be taken before the server binds it


def in_ci() -> bool:
    """True when the ``CI`` environment variable says this is a CI run."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


@dataclass
class Servers:
    """Where the test servers are, how they were found, and how to stop them."""

    urls: dict[str, str | None]
    source: str
    missing: dict[str, str] = field(default_factory=dict)  # kind -> why it is not available
    started_in: float | None = None
    stopped_in: float | None = None
    #: The base directory of the servers tests/services.sh started (it adds virtual hosts).
    svc_base: Path | None = None
    _stop: Callable[[], None] | None = None

    def stop(self) -> None:
        """Stop the servers this session started; safe to call more than once."""
        stop, self._stop = self._stop, None
        if stop is not None:
            t = time.monotonic()
            stop()
            self.stopped_in = time.monotonic() - t

    def reason(self, kind: str) -> str:
        return self.missing.get(kind) or f"not provided by {self.source}"


# ----------------------------------------------------------------------------- ports


def port_free(port: int) -> bool:
    """True if nothing on 127.0.0.1 holds ``port``."""
    with socket.socket() as s:
        # as the servers do, so that a port in TIME_WAIT counts as free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(n: int = 1, taken: set[int] | None = None) -> int:
    """A port p with p .. p+n-1 free, below the ephemeral range (32768+)."""
    taken = set() if taken is None else taken
    for _ in range(500):
        p = random.randrange(20000, 32000)
        block = set(range(p, p + n))
        if not block & taken and all(port_free(q) for q in block):
            taken.update(block)
            return p
    raise RuntimeError(f"no block of {n} free port(s) found")


# ----------------------------------------------------------------------------- 1, 2: given servers


def read_services_env(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of a services.env file."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def _from_services_env(path: Path) -> Servers:
    if not path.is_file():
        raise RuntimeError(f"{SERVICES_ENV_VAR}={path}: no such file (stale tests/run.sh env?)")
    env = read_services_env(path)
    urls = {kind: env.get(key) or None for kind, key in _ENV_KEYS.items()}
    missing = {kind: f"not in {path}" for kind, url in urls.items() if url is None}
    base = Path(env["SVC_BASE"]) if env.get("SVC_BASE") and env.get("RMQ_PORT") else None
    return Servers(urls, f"servers of {path}", missing, svc_base=base)


def _from_url_vars() -> Servers | None:
    urls = {kind: os.environ.get(var) or None for kind, var in URL_VARS.items()}
    if not any(urls.values()):
        return None
    missing = {kind: f"{URL_VARS[kind]} is not set" for kind, url in urls.items() if url is None}
    return Servers(urls, "TXTASKS_TEST_*_URL variables", missing)


# ----------------------------------------------------------------------------- 3: docker


def docker_available() -> bool:
    """True if a Docker engine answers (the docker CLI alone is not enough)."""
    if os.environ.get("TXTASKS_TEST_DOCKER", "1") == "0":
        return False
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False  # nothing to ask; docker-py would leak a socket finding that out
    try:
        import docker
    except ImportError:
        return False
    # a failed probe leaves unclosed sockets (ResourceWarning, an error under -W error)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        ok = _docker_ping(docker)
        gc.collect()
    return ok


def _docker_ping(docker: Any) -> bool:
    client = None
    try:
        client = docker.from_env(timeout=3)
        client.ping()
    except Exception:  # docker.errors.DockerException and friends: no engine
        return False
    finally:
        if client is not None:
            client.close()
    return True


def _testcontainers(module: str, name: str) -> Any:
    """``testcontainers.community.<module>.<name>``, or the older ``testcontainers.<module>``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for path in (f"testcontainers.community.{module}", f"testcontainers.{module}"):
            with contextlib.suppress(ImportError):
                return getattr(importlib.import_module(path), name)
    raise ImportError(f"testcontainers has no {module}.{name}")


def amqp_ready(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if an AMQP 0-9-1 broker answers the protocol header with Connection.Start."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            return s.recv(1) == b"\x01"  # a METHOD frame
    except OSError:
        return False


def _start_containers() -> Servers:
    stack = contextlib.ExitStack()

    def stop() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stack.close()

    t = time.monotonic()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            urls = _run_containers(stack)
    except BaseException:
        stop()
        raise
    missing = {"pgbouncer": "not started with testcontainers (tests/services.sh starts one)"}
    took = time.monotonic() - t
    return Servers(urls, "testcontainers (Docker)", missing, took, _stop=stop)


def _run_containers(stack: contextlib.ExitStack) -> dict[str, str | None]:
    postgres_container = _testcontainers("postgres", "PostgresContainer")
    mysql_container = _testcontainers("mysql", "MySqlContainer")
    docker_container = _testcontainers("core.container", "DockerContainer")
    log_wait = _testcontainers("core.wait_strategies", "LogMessageWaitStrategy")

    pg_cmd = "postgres -c max_connections=200"
    if os.environ.get("PG_FAST", "1") != "0":
        pg_cmd += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    pg = postgres_container(
        "postgres:15", username=USER, password=PASSWORD, dbname=DB, driver=None
    ).with_command(pg_cmd)
    my = mysql_container("mariadb:10.11", username=USER, password=PASSWORD, dbname=DB).with_command(
        "--max-connections=300 --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci"
    )
    mq = (
        docker_container("rabbitmq:3.10")
        .with_env("RABBITMQ_DEFAULT_USER", USER)
        .with_env("RABBITMQ_DEFAULT_PASS", PASSWORD)
        .with_exposed_ports(5672)
        .waiting_for(log_wait("Server startup complete"))
    )
    for container in (pg, my, mq):
        stack.callback(container.stop)
        container.start()

    def addr(container: Any, port: int) -> str:
        return f"{container.get_container_host_ip()}:{container.get_exposed_port(port)}"

    host, amqp_port = addr(mq, 5672).rsplit(":", 1)
    answers = partial(amqp_ready, host, int(amqp_port))
    until_sync(answers, "the RabbitMQ container to answer AMQP", timeout=60, interval=0.2)
    return {
        "postgresql": f"postgresql://{USER}:{PASSWORD}@{addr(pg, 5432)}/{DB}",
        "pgbouncer": None,
        "mysql": f"mysql://{USER}:{PASSWORD}@{addr(my, 3306)}/{DB}",
        "amqp": f"amqp://{USER}:{PASSWORD}@{addr(mq, 5672)}/",
    }


# ----------------------------------------------------------------------------- 4: local binaries


def local_binaries() -> dict[str, bool]:
    """Which of the Debian server binaries that tests/services.sh runs are installed."""
    postgresql = bool(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return {
        "postgresql": postgresql,
        "pgbouncer": postgresql and os.access("/usr/sbin/pgbouncer", os.X_OK),
        "mysql": os.access("/usr/sbin/mariadbd", os.X_OK),
        "amqp": os.access("/usr/lib/rabbitmq/bin/rabbitmq-server", os.X_OK)
        and shutil.which("epmd") is not None,
    }


def services_sh() -> Path:
    return Path(os.environ.get("TXTASKS_TEST_SERVICES_SH") or SERVICES_SH)


def _sh(script: Path, cmd: str, base: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run ``script cmd base``; (exit code, stderr). A timeout kills it and gives code -9."""
    try:
        r = subprocess.run(
            ["bash", str(script), cmd, str(base)],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        return -9, f"{err}\n(timed out after {timeout:.0f}s)"
    return r.returncode, r.stderr


def _start_local(kinds: list[str]) -> Servers:
    script = services_sh()
    base = Path(tempfile.mkdtemp(prefix="txtasks-svc.", dir="/tmp"))  # not pytest's 0700 tmp
    timeout = 4 * int(os.environ.get("SVC_TIMEOUT", "60")) + 30
    env = dict(os.environ, SERVICES=" ".join(_SH_NAMES[k] for k in kinds))
    env.pop("SVC_BASE", None)

    def stop() -> None:
        rc, err = _sh(script, "stop", base, env, timeout)
        shutil.rmtree(base, ignore_errors=True)
        if rc != 0:
            warnings.warn(f"{script} stop {base} failed (rc {rc}):\n{err}", stacklevel=1)

    for attempt in range(1, _START_ATTEMPTS + 1):
        taken: set[int] = set()
        env.update(
            PG_PORT=str(free_port_block(1, taken)),
            PGB_PORT=str(free_port_block(1, taken)),
            MY_PORT=str(free_port_block(1, taken)),
            RMQ_PORT=str(free_port_block(3, taken)),
        )
        t = time.monotonic()
        rc, err = _sh(script, "start", base, env, timeout)
        if rc == 0:
            urls = read_services_env(base / "services.env")
            found: dict[str, str | None] = {k: urls.get(_ENV_KEYS[k]) for k in KINDS}
            missing = {
                k: "not installed (run: bash tests/install-deps.sh)"
                for k in KINDS
                if k not in kinds
            }
            source = f"private servers from {script} in {base}"
            took = time.monotonic() - t
            return Servers(found, source, missing, took, svc_base=base, _stop=stop)
        _sh(script, "stop", base, env, timeout)  # services.sh cleans up itself; be sure
        if "busy" not in err or attempt == _START_ATTEMPTS:
            shutil.rmtree(base, ignore_errors=True)
            tail = "\n".join(err.strip().splitlines()[-40:])
            raise RuntimeError(f"{script} start {base} failed (rc {rc}):\n{tail}")
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------- resolution


def given_servers() -> Servers | None:
    """The servers the environment names (1 and 2 of the module docstring), or None."""
    env_file = os.environ.get(SERVICES_ENV_VAR)
    if env_file:
        return _from_services_env(Path(env_file))
    return _from_url_vars()


def find_servers() -> Servers:
    """Locate or start the test servers (see the module docstring for the order)."""
    given = given_servers()
    if given is not None:
        return given
    docker_error = ""
    if docker_available():
        # a failed docker-py client leaves unclosed sockets behind (ResourceWarning)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                return _start_containers()
            except Exception as e:  # e.g. images that cannot be pulled: try the local binaries
                docker_error = f"testcontainers failed: {type(e).__name__}: {e}"
            gc.collect()
    script = services_sh()
    have = local_binaries()
    kinds = [k for k in KINDS if have[k]]
    if kinds and script.is_file():
        servers = _start_local(kinds)
        if docker_error:
            servers.source += f" ({docker_error})"
        return servers
    if docker_error:
        raise RuntimeError(docker_error)
    why = (
        f"the services script {script} is not there"
        if not script.is_file()
        else "no Docker engine and no server binaries (run: bash tests/install-deps.sh)"
    )
    return Servers(dict.fromkeys(KINDS), "nothing", dict.fromkeys(KINDS, why))


@contextlib.contextmanager
def _stop_on_sigterm(servers: Servers) -> Iterator[None]:
    """SIGTERM ends the session like Ctrl-C (so teardown runs); atexit is the last resort."""
    if servers._stop is None:  # nothing started here, nothing to stop
        yield
        return
    atexit.register(servers.stop)
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    installed = previous == signal.SIG_DFL
    if installed:
        with contextlib.suppress(ValueError):  # not in the main thread
            signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if installed:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, previous)
        servers.stop()
        atexit.unregister(servers.stop)


_session_servers: list[Servers] = []  # for the terminal summary


@pytest.fixture(scope="session")
def txtasks_servers() -> Iterator[Servers]:
    """The :class:`Servers` of this session (``services`` gives just the URLs)."""
    try:
        servers = find_servers()
    except Exception as e:
        pytest.fail(f"test servers: {e}", pytrace=False)
    _session_servers.append(servers)
    with _stop_on_sigterm(servers):
        yield servers


def _require(servers: Servers, kind: str) -> str:
    url = servers.urls.get(kind)
    if url:
        return url
    msg = f"{LABELS[kind]} server not available: {servers.reason(kind)}"
    if in_ci():
        pytest.fail(f"{msg} (CI is set: a missing server is a failure)", pytrace=False)
    pytest.skip(msg)


def _own_database(servers: Servers, kind: str) -> Iterator[str]:
    """This process's migrated database on the server of `kind`, dropped at the end."""
    base = _require(servers, kind)
    name = isolation.own_name()
    try:
        url = isolation.create_database(kind, base, name)
    except RuntimeError as e:
        failed = str(e)
    else:
        failed = ""
    if failed:
        pytest.fail(failed, pytrace=False)
    yield url
    try:
        isolation.drop_databases(kind, base, isolation.like_literal(name))
    except Exception as e:  # the run's end drops what is left (pytest_sessionfinish)
        print(f"\ntxtasks test servers: could not drop {name}: {e}")


@pytest.fixture(scope="session")
def postgres_url(txtasks_servers: Servers) -> Iterator[str]:
    """``postgresql://app:app@HOST:PORT/txt_<run>_<worker>``, this process's own migrated
    database; skips (fails in CI) without a server."""
    yield from _own_database(txtasks_servers, "postgresql")


@pytest.fixture(scope="session")
def pgbouncer_url(txtasks_servers: Servers, postgres_url: str) -> str:
    """``postgresql://app:app@HOST:PGB_PORT/txt_<run>_<worker>?pooler=transaction``: this
    process's own PostgreSQL database (``postgres_url``'s) through PgBouncer in transaction
    pooling mode; skips (fails in CI) without one."""
    base = _require(txtasks_servers, "pgbouncer")
    name = make_url(postgres_url).database or ""
    return isolation.with_database(base, name) + "?pooler=transaction"


@pytest.fixture(scope="session")
def mysql_url(txtasks_servers: Servers) -> Iterator[str]:
    """``mysql://app:app@HOST:PORT/txt_<run>_<worker>``, this process's own migrated database;
    skips (fails in CI) without a server."""
    yield from _own_database(txtasks_servers, "mysql")


@pytest.fixture(scope="session")
def amqp_url(txtasks_servers: Servers) -> Iterator[str]:
    """``amqp://app:app@HOST:PORT/txt_<run>_<worker>``, a virtual host of this process's own on
    a broker tests/services.sh started (a broker given by URL is used as given); skips (fails in
    CI) without a broker."""
    base = _require(txtasks_servers, "amqp")
    if txtasks_servers.svc_base is None:
        yield base
        return
    name, script = isolation.own_name(), services_sh()
    try:
        isolation.vhost_command(script, txtasks_servers.svc_base, "vhost", name)
    except Exception as e:
        pytest.fail(f"test broker: {e}", pytrace=False)
    yield isolation.with_vhost(base, name)
    with contextlib.suppress(Exception):
        isolation.vhost_command(script, txtasks_servers.svc_base, "vhost-drop", name)


def pytest_configure(config: pytest.Config) -> None:
    """The run's token, before pytest-xdist starts its workers (they inherit it)."""
    isolation.run_token()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The process that ran the session (not a pytest-xdist worker) drops what is left of the
    run's databases on servers it did not start: the template, a crashed worker's."""
    if hasattr(session.config, "workerinput"):
        return
    servers = given_servers()
    if servers is None:
        return  # servers started by the fixtures: stopped with everything on them
    pattern = isolation.like_literal(f"{isolation.PREFIX}{isolation.run_token()}_") + "%"
    for kind in ("postgresql", "mysql"):
        url = servers.urls.get(kind)
        if url:
            with contextlib.suppress(Exception):
                isolation.drop_databases(kind, url, pattern)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line on where the servers came from, with start and stop times."""
    for servers in _session_servers:
        times = ""
        if servers.started_in is not None:
            times += f", started in {servers.started_in:.1f}s"
        if servers.stopped_in is not None:
            times += f", stopped in {servers.stopped_in:.1f}s"
        terminalreporter.write_line(f"txtasks test servers: {servers.source}{times}")
    _session_servers.clear()
