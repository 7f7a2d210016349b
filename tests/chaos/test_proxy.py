"""The fault modes of tests/tcp_proxy.py, against an echo server: each does what it says."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.tcp_proxy import ProxyThread

pytestmark = pytest.mark.chaos
WAIT = 2.0


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    """A threaded echo server on a free port."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # the proxy resets it
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()
    stop.set()
    server.close()


_opened: list[socket.socket] = []


@pytest.fixture
def proxy(echo: tuple[str, int]) -> Iterator[ProxyThread]:
    with ProxyThread(*echo) as p:
        yield p
    while _opened:
        _opened.pop().close()


def connect(proxy: ProxyThread) -> socket.socket:
    """A client connection through the proxy (closed at the end of the test)."""
    sock = socket.create_connection(("127.0.0.1", proxy.proxy.port), timeout=WAIT)
    _opened.append(sock)
    sock.settimeout(WAIT)
    return sock


def roundtrip(sock: socket.socket, data: bytes = b"ping") -> bytes:
    sock.sendall(data)
    return sock.recv(4096)


def silent(sock: socket.socket, seconds: float = 0.3) -> bool:
    """True if nothing arrives for `seconds` (and the connection is still open)."""
    sock.settimeout(seconds)
    try:
        data = sock.recv(4096)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(WAIT)
    raise AssertionError(f"expected silence, got {data!r}")


def test_reset_aborts_every_connection_with_a_rst(proxy: ProxyThread) -> None:
    sock = connect(proxy)
    assert roundtrip(sock) == b"ping"
    assert proxy.reset() == 1
    with pytest.raises(ConnectionResetError):
        roundtrip(sock)
    assert roundtrip(connect(proxy)) == b"ping"  # new connections work


def test_blackhole_holds_bytes_of_open_and_new_connections_until_restored(
    proxy: ProxyThread,
) -> None:
    old = connect(proxy)
    assert roundtrip(old) == b"ping"
    proxy.blackhole(include_new=True)
    old.sendall(b"held")
    assert silent(old)
    new = connect(proxy)  # accepted, but carries nothing
    new.sendall(b"new")
    assert silent(new)
    proxy.restore()
    assert old.recv(4096) == b"held"  # nothing lost: the stream carries on
    assert new.recv(4096) == b"new"


def test_blackhole_of_open_connections_only_for_a_duration(proxy: ProxyThread) -> None:
    old = connect(proxy)
    assert roundtrip(old) == b"ping"  # the proxy has it
    proxy.blackhole(include_new=False, duration=1.0)
    t = time.monotonic()
    old.sendall(b"late")
    assert roundtrip(connect(proxy)) == b"ping"  # new connections are not affected
    assert old.recv(4096) == b"late"
    assert 0.9 < time.monotonic() - t < WAIT


def test_freeze_stalls_open_connections_for_good_and_new_ones_work(proxy: ProxyThread) -> None:
    old = connect(proxy)
    assert roundtrip(old) == b"ping"
    assert proxy.freeze() == 1
    old.sendall(b"lost")
    assert silent(old)
    proxy.restore()  # ends blackholes, not a freeze
    assert silent(old)
    assert roundtrip(connect(proxy)) == b"ping"


def test_flap_resets_at_random_intervals_for_its_duration(proxy: ProxyThread) -> None:
    flapping = proxy.flap((0.1, 0.2), duration=1.0)
    resets = 0
    t = time.monotonic()
    while not flapping.done():
        sock = connect(proxy)
        try:
            while not flapping.done():
                roundtrip(sock)
                time.sleep(0.01)
        except (ConnectionResetError, BrokenPipeError):
            resets += 1
        except OSError:
            pass  # the reset hit before anything came back
    assert 5 <= flapping.result() <= 10
    assert resets >= 4
    assert time.monotonic() - t < 1.5
    assert roundtrip(connect(proxy)) == b"ping"


def test_refuse_and_accept_still_work(proxy: ProxyThread) -> None:
    sock = connect(proxy)
    assert roundtrip(sock) == b"ping"
    proxy.refuse()
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)
    assert roundtrip(sock, b"") == b""  # the open one was dropped
    proxy.accept()
    assert roundtrip(connect(proxy)) == b"ping"


def test_a_down_flap_carries_nothing_between_resets_then_recovers(proxy: ProxyThread) -> None:
    old = connect(proxy)
    assert roundtrip(old) == b"ping"
    flapping = proxy.flap((0.2, 0.3), duration=0.8, down=True)
    new = connect(proxy)
    new.sendall(b"held")
    with pytest.raises(ConnectionResetError):
        new.recv(4096)  # nothing came back before the next reset
    assert flapping.result(timeout=WAIT) >= 2
    assert roundtrip(connect(proxy)) == b"ping"  # up again
