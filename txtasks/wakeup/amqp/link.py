"""What publishers and subscribers share: the topology (exchange, queue names, declarations),
the reconnect policy and how an outage is logged (once when it starts, once when it ends)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aio_pika
import aiormq
from yarl import URL

from txtasks.retry import Exponential, RetryStrategy

log = logging.getLogger("txtasks.wakeup")

EXCHANGE = "txtasks.wakeup"
QUEUE_PREFIX = "txtasks.wakeup."
#: Hints older than this are useless: workers will have polled by then.
MESSAGE_TTL_MS = 60_000
#: A queue nobody consumes keeps at most this many hints (the oldest are dropped).
MAX_QUEUE_LENGTH = 10_000
PROPERTIES = aiormq.spec.Basic.Properties(content_type="application/json", delivery_mode=1)
#: The wait before connection attempt n+1 after n failures in a row, for publishers and
#: subscribers alike: exponential from 0.1 s, capped at 3 s, with full jitter. A connection that
#: works starts it over. Pass another `RetryStrategy` as `AmqpNotifier(reconnect=...)`.
RECONNECT_BACKOFF = Exponential(base=0.1, cap=3.0)
#: Bound of one subscriber connection attempt: TCP, AMQP handshake, declarations, consume.
CONNECT_TIMEOUT = 5.0
#: A new connection ends an outage (logged back, backoff reset) once it has lasted this long,
#: so a flapping network is one outage, not two log lines per flap.
STABLE_AFTER = 3.0
#: Seconds between heartbeats on a broker connection (the client's value; the broker agrees to
#: it). A connection that carries no frame for (HEARTBEAT + 1) x 3 = 12 seconds is taken as lost
#: and replaced: a frozen link (half-open, so neither side hears of it) is noticed within 15 s,
#: not after the 3 minutes of the 60 s default. A URL's own `?heartbeat=` wins.
HEARTBEAT = 3
#: aiormq's lines about each failed or lost connection: txtasks logs the outage once instead.
PER_ATTEMPT_LINES = (
    "error when creating transport",
    "Cancelling cause reader exited abnormally",
    "Unexpected connection close from remote",
    "Server connection",  # ... was stuck: no frames within the heartbeat's grace
    # (its channel's logger) an attempt cut short cancels the RPC under way: a declare of the
    # exchange, the channel's opening
    "Closing channel",
)
#: The aiormq loggers that say them.
PER_ATTEMPT_LOGGERS = ("aiormq.connection", "aiormq.channel")


def amqp_queue_name(queue: str) -> str:
    return QUEUE_PREFIX + queue


async def declare(channel: aio_pika.abc.AbstractChannel, queue: str) -> Any:
    """Declare the exchange and the wake-up queue of `queue`, bound by the queue name."""
    exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
    amqp_queue = await channel.declare_queue(
        amqp_queue_name(queue),
        durable=False,
        arguments={
            "x-message-ttl": MESSAGE_TTL_MS,
            "x-max-length": MAX_QUEUE_LENGTH,
            "x-overflow": "drop-head",
        },
    )
    await amqp_queue.bind(exchange, routing_key=queue)
    return amqp_queue


def connect_url(url: str) -> URL:
    """The broker URL to connect with: `heartbeat=HEARTBEAT` unless it names its own."""
    parsed = URL(url)
    return parsed if "heartbeat" in parsed.query else parsed.update_query(heartbeat=HEARTBEAT)


def safe_url(url: str) -> str:
    """The broker URL for logs: its password masked."""
    parsed = URL(url)
    return str(parsed.with_password("******")) if parsed.password else url


def describe(exc: BaseException) -> str:
    """One line naming an error: its type, and its text when it has one."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class PerAttemptLines(logging.Filter):
    """Turns aiormq's line per failed connection into DEBUG: txtasks logs the outage once."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not str(record.msg).startswith(PER_ATTEMPT_LINES):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_library_loggers() -> None:
    """Install the filter on aiormq's connection and channel loggers (once)."""
    for name in PER_ATTEMPT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, PerAttemptLines) for f in logger.filters):
            logger.addFilter(PerAttemptLines())


quiet_library_loggers()


class Outage:
    """The broker as one connection sees it: one WARNING when lost, one INFO when back, and the
    wait before each attempt in between (DEBUG lines only)."""

    def __init__(self, what: str, url: str, reconnect: RetryStrategy) -> None:
        self.what = what
        self.broker = safe_url(url)
        self.reconnect = reconnect
        self.failures = 0
        self._since = 0.0
        self._stable: asyncio.TimerHandle | None = None

    def failed(self, exc: BaseException) -> float:
        """Count a failed or lost connection; the seconds to wait before the next attempt."""
        self.stop()
        self.failures += 1
        delay = self.reconnect.delay(self.failures)
        if self.failures == 1:
            self._since = time.monotonic()
            log.warning(
                "%s: broker %s unavailable: %s (workers poll meanwhile; reconnecting with backoff)",
                self.what,
                self.broker,
                describe(exc),
            )
        else:
            log.debug(
                "%s: attempt %d failed (%s), next in %.2fs",
                self.what,
                self.failures,
                describe(exc),
                delay,
            )
        return delay

    def connected(self) -> None:
        """A connection works: the outage is over if it lasts `STABLE_AFTER` (see `failed`)."""
        took = time.monotonic() - self._since
        self._stable = asyncio.get_running_loop().call_later(STABLE_AFTER, self._over, took)

    def stop(self) -> None:
        """The connection is gone, or closed on purpose: it never counts as stable."""
        if self._stable is not None:
            self._stable.cancel()

    def _over(self, took: float) -> None:
        if self.failures:
            log.info("%s: broker %s back after %.1fs", self.what, self.broker, took)
        self.failures = 0
