"""A small asyncio TCP proxy for tests that cut a client off from its server, or break the network
between them in the ways real networks break.

    proxy = await TcpProxy.start("127.0.0.1", 5672)   # listens on 127.0.0.1:<free port>
    url = proxy.url_for("amqp://app:app@127.0.0.1:5672/")
    proxy.drop_all()        # abort every proxied connection (both sides); new ones still work
    await proxy.refuse()    # stop listening (connections are refused) and drop every connection
    await proxy.accept()    # listen again, on the same port
    await proxy.close()

Faults (each can be undone with `restore()`, which also ends a flap):

    proxy.reset()                               # abort every connection now, with a TCP RST
    proxy.blackhole(include_new=True)           # no byte moves either way; sockets stay open;
                                                # include_new: connections made meanwhile too
    proxy.blackhole(include_new=False, duration=5)   # only the open ones, for 5 s
    proxy.flap((0.3, 1.5), duration=15)         # reset every 0.3-1.5 s (random) for 15 s
    proxy.flap((0.3, 1.5), 5, down=True)        # the same, and nothing moves in between
    proxy.freeze()                              # the open connections stall for good (half-open:
                                                # neither side learns); new connections work
    proxy.restore()                             # bytes flow again (frozen connections stay frozen)

A blackhole holds the bytes, it does not lose them: a connection that outlives it carries on
where it stopped, as TCP's retransmission would.

`TcpProxy` runs on the event loop that started it, so that loop must keep running (an async test
does). `ProxyThread` runs one on an event loop of its own, in a thread, for synchronous tests
whose clients are subprocesses:

    with ProxyThread.for_url(database_url) as proxy:
        url = proxy.url_for(database_url)
        proxy.flap((0.3, 1.5), duration=15)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

CHUNK = 64 * 1024
T = TypeVar("T")


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's side, the server's side, and its gate."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    #: Set while bytes may move; cleared by a blackhole or a freeze.
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    frozen: bool = False
    pumps: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self, rst: bool) -> None:
        for writer in (self.client, self.upstream):
            if writer is None:
                continue
            if rst:
                _linger_zero(writer)
            writer.transport.abort()
        for pump in self.pumps:
            pump.cancel()


def _linger_zero(writer: asyncio.StreamWriter) -> None:
    """Make the next close send a RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class TcpProxy:
    """Forwards every connection made to 127.0.0.1:`port` to `target_host`:`target_port`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = "127.0.0.1"
        self.port = 0
        #: Connections accepted since the start (a reconnecting client makes it grow).
        self.accepted = 0
        #: Connections aborted by `reset()`/`drop_all()`/`refuse()`, flaps included.
        self.resets = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._faults: set[asyncio.Task[Any]] = set()
        self._blackhole_new = False

    @classmethod
    async def start(cls, target_host: str, target_port: int) -> TcpProxy:
        proxy = cls(target_host, target_port)
        await proxy.accept()
        return proxy

    @classmethod
    async def for_url(cls, url: str) -> TcpProxy:
        """A proxy in front of the server of `url` (scheme://user:pass@host:port/...)."""
        return await cls.start(*target_of(url))

    def url_for(self, url: str) -> str:
        """`url` with its host:port replaced by the proxy's."""
        parts = urlsplit(url)
        credentials, _, _ = parts.netloc.rpartition("@")
        netloc = f"{credentials}@{self.host}:{self.port}" if credentials else self.address
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def listening(self) -> bool:
        return self._server is not None

    @property
    def connections(self) -> int:
        """Client connections open right now (frozen ones included)."""
        return len(self._links)

    async def accept(self) -> None:
        """Listen (again): on a free port the first time, on the same port afterwards."""
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def refuse(self) -> None:
        """Stop listening (new connections are refused) and drop every open connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.drop_all()
        if server is not None:
            await server.wait_closed()
        await self._settle()

    def drop_all(self) -> None:
        """Abort every proxied connection, client and server side, as a network failure would."""
        self._abort_links(rst=False)

    # -- faults -----------------------------------------------------------------------------

    def reset(self) -> int:
        """Abort every proxied connection now with a TCP RST to both sides; how many."""
        return self._abort_links(rst=True)

    def blackhole(self, *, include_new: bool, duration: float | None = None) -> None:
        """Stop moving bytes both ways on the open connections, keeping their sockets open.

        include_new: connections made while it lasts are accepted (and connected to the
        server) but carry nothing either. `duration`: `restore()` after that many seconds;
        None: until `restore()` is called.
        """
        self._blackhole_new = include_new
        for link in self._links:
            link.flowing.clear()
        if duration is not None:
            self._spawn(self._restore_after(duration))

    def freeze(self) -> int:
        """The open connections stall for good, both ways, sockets open on both sides (a
        half-open connection: neither client nor server hears of it); new connections work.
        How many were frozen."""
        for link in self._links:
            link.frozen = True
            link.flowing.clear()
        return len(self._links)

    def flap(
        self, period_range: tuple[float, float], duration: float, *, down: bool = False
    ) -> asyncio.Task[int]:
        """Reset every connection at random intervals in `period_range` seconds, for `duration`
        seconds. The task's result is how many resets happened.

        down: also carry nothing in between (a blackhole of every connection, new ones too, that
        ends with the flap): a network that is down and resets connections as it goes.
        """
        low, high = period_range
        if not 0 < low <= high or not duration > 0:
            raise ValueError(f"flap({period_range!r}, {duration!r}): need 0 < low <= high, > 0")
        if down:
            self.blackhole(include_new=True)
        return self._spawn(self._flap(low, high, duration, down))

    def restore(self) -> None:
        """End blackholes and flaps: bytes flow again (frozen connections stay frozen)."""
        for task in list(self._faults):
            if task is not asyncio.current_task():
                task.cancel()
        self._unblock()

    async def close(self) -> None:
        """Stop listening, drop every connection and end every task the proxy started."""
        for task in list(self._faults):
            task.cancel()
        await asyncio.gather(*self._faults, return_exceptions=True)
        await self.refuse()
        handlers = list(self._handlers)
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    # -- inside -----------------------------------------------------------------------------

    def _unblock(self) -> None:
        self._blackhole_new = False
        for link in self._links:
            if not link.frozen:
                link.flowing.set()

    def _abort_links(self, rst: bool) -> int:
        links, self._links = self._links, set()
        for link in links:
            link.abort(rst)
        self.resets += len(links)
        return len(links)

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._faults.add(task)
        task.add_done_callback(self._faults.discard)
        return task

    async def _restore_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self.restore()

    async def _flap(self, low: float, high: float, duration: float, down: bool) -> int:
        loop = asyncio.get_running_loop()
        end = loop.time() + duration
        count = 0
        try:
            while (left := end - loop.time()) > 0:
                await asyncio.sleep(min(random.uniform(low, high), left))
                if loop.time() < end:
                    self.reset()
                    count += 1
        finally:
            if down:
                self._unblock()
        return count

    async def _settle(self) -> None:
        """Let the handlers of aborted connections see their end."""
        handlers = list(self._handlers)
        if handlers:
            await asyncio.wait(handlers, timeout=1.0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        self._handlers.add(me)
        try:
            await self._forward(reader, writer)
        finally:
            self._handlers.discard(me)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(writer)
        if not self._blackhole_new:
            link.flowing.set()
        self._links.add(link)
        try:
            up_reader, link.upstream = await asyncio.open_connection(
                self.target_host, self.target_port
            )
            if link not in self._links:  # dropped while connecting upstream
                return
            link.pumps = [
                asyncio.create_task(self._pump(reader, link.upstream, link)),
                asyncio.create_task(self._pump(up_reader, writer, link)),
            ]
            try:
                await asyncio.wait(link.pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in link.pumps:
                    pump.cancel()
                await asyncio.gather(*link.pumps, return_exceptions=True)
        except OSError:
            pass  # the server is not there: the client sees its connection closed
        finally:
            self._links.discard(link)
            link.abort(rst=False)

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await link.flowing.wait()
                data = await reader.read(CHUNK)
                await link.flowing.wait()  # what arrives during a blackhole waits for its end
                if not data:
                    return
                writer.write(data)
                await writer.drain()


def target_of(url: str) -> tuple[str, int]:
    """(host, port) of the server of `url`."""
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"{url!r} names no host:port")
    return parts.hostname, parts.port


class ProxyThread:
    """A `TcpProxy` on an event loop of its own in a daemon thread: it keeps forwarding while
    a synchronous test blocks (on subprocesses, on the database). Same methods, synchronous."""

    TIMEOUT = 10.0

    def __init__(self, target_host: str, target_port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"tcp-proxy-{target_port}", daemon=True
        )
        self._thread.start()
        try:
            self.proxy = self._await(TcpProxy.start(target_host, target_port))
        except BaseException:
            self._stop_loop()
            raise

    @classmethod
    def for_url(cls, url: str) -> ProxyThread:
        return cls(*target_of(url))

    def __enter__(self) -> ProxyThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url_for(self, url: str) -> str:
        return self.proxy.url_for(url)

    @property
    def accepted(self) -> int:
        return self.proxy.accepted

    @property
    def connections(self) -> int:
        return self.proxy.connections

    @property
    def resets(self) -> int:
        return self.proxy.resets

    def accept(self) -> None:
        self._await(self.proxy.accept())

    def refuse(self) -> None:
        self._await(self.proxy.refuse())

    def drop_all(self) -> None:
        self._call(self.proxy.drop_all)

    def reset(self) -> int:
        return self._call(self.proxy.reset)

    def blackhole(self, *, include_new: bool, duration: float | None = None) -> None:
        self._call(lambda: self.proxy.blackhole(include_new=include_new, duration=duration))

    def freeze(self) -> int:
        return self._call(self.proxy.freeze)

    def restore(self) -> None:
        self._call(self.proxy.restore)

    def flap(
        self, period_range: tuple[float, float], duration: float, *, down: bool = False
    ) -> concurrent.futures.Future[int]:
        """Starts flapping; the future's result is how many resets happened."""

        async def flapping() -> int:
            return await self.proxy.flap(period_range, duration, down=down)

        return asyncio.run_coroutine_threadsafe(flapping(), self._loop)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._await(self.proxy.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.TIMEOUT)
        self._loop.close()

    def _await(self, awaitable: Awaitable[T]) -> T:
        async def run() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(self.TIMEOUT)

    def _call(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        return self._await(run())
