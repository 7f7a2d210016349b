"""A small asyncio TCP proxy for tests that cut a client off from its server.

    proxy = await TcpProxy.start("127.0.0.1", 5672)   # listens on 127.0.0.1:<free port>
    url = proxy.url_for("amqp://app:app@127.0.0.1:5672/")
    proxy.drop_all()        # abort every proxied connection (both sides); new ones still work
    await proxy.refuse()    # stop listening (connections are refused) and drop every connection
    await proxy.accept()    # listen again, on the same port
    await proxy.close()

It runs on the event loop that started it, so that loop must keep running (an async test does).
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

CHUNK = 64 * 1024


class TcpProxy:
    """Forwards every connection made to 127.0.0.1:`port` to `target_host`:`target_port`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = "127.0.0.1"
        self.port = 0
        #: Connections accepted since the start (a reconnecting client makes it grow).
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, target_host: str, target_port: int) -> TcpProxy:
        proxy = cls(target_host, target_port)
        await proxy.accept()
        return proxy

    @classmethod
    async def for_url(cls, url: str) -> TcpProxy:
        """A proxy in front of the server of `url` (scheme://user:pass@host:port/...)."""
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"{url!r} names no host:port")
        return await cls.start(parts.hostname, parts.port)

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
        """Client connections open right now."""
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
        links, self._links = self._links, set()
        for client, upstream in links:
            client.transport.abort()
            if upstream is not None:
                upstream.transport.abort()

    async def close(self) -> None:
        """Stop listening, drop every connection and end every task the proxy started."""
        await self.refuse()
        handlers = list(self._handlers)
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

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
        link: tuple[asyncio.StreamWriter, asyncio.StreamWriter | None] = (writer, None)
        self._links.add(link)
        upstream: asyncio.StreamWriter | None = None
        try:
            up_reader, upstream = await asyncio.open_connection(self.target_host, self.target_port)
            if link not in self._links:  # dropped while connecting upstream
                return
            self._links.discard(link)
            link = (writer, upstream)
            self._links.add(link)
            pumps = [
                asyncio.create_task(self._pump(reader, upstream)),
                asyncio.create_task(self._pump(up_reader, writer)),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except OSError:
            pass  # the server is not there: the client sees its connection closed
        finally:
            self._links.discard(link)
            writer.transport.abort()
            if upstream is not None:
                upstream.transport.abort()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
