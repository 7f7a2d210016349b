"""RabbitMQ wake-ups through aio-pika.

Topology: a direct exchange `txtasks.wakeup`, and one AMQP queue per task queue
(`txtasks.wakeup.<queue>`) that every worker of that queue consumes from: competing consumers,
so one message wakes one worker. Messages are small JSON, non-persistent, with a TTL; consumers
take them without acks. Nothing in RabbitMQ is state: delays and retries live in the table.

Publishing runs on a background thread with its own event loop, so sync and async callers alike
hand a hint over in microseconds and never wait for the broker: a slow or absent broker means
hints are buffered (bounded), then dropped and counted, never raised into the application.

A broker that is away: publishers and subscribers reconnect by one policy (`RECONNECT_BACKOFF`,
exponential with full jitter, capped at 3 s) on plain connections (aio-pika's robust connection
retries at a fixed interval and logs each attempt), and each connection logs the outage twice:
a WARNING when it goes, an INFO when it is back.
"""

from txtasks.wakeup.amqp.link import (
    CONNECT_TIMEOUT,
    EXCHANGE,
    MAX_QUEUE_LENGTH,
    MESSAGE_TTL_MS,
    QUEUE_PREFIX,
    RECONNECT_BACKOFF,
    STABLE_AFTER,
    amqp_queue_name,
    quiet_library_loggers,
    safe_url,
)
from txtasks.wakeup.amqp.notifier import AmqpNotifier
from txtasks.wakeup.amqp.publisher import AmqpPublisher, LoopPublisher
from txtasks.wakeup.amqp.subscriber import AmqpSubscriber

__all__ = [
    "CONNECT_TIMEOUT",
    "EXCHANGE",
    "MAX_QUEUE_LENGTH",
    "MESSAGE_TTL_MS",
    "QUEUE_PREFIX",
    "RECONNECT_BACKOFF",
    "STABLE_AFTER",
    "AmqpNotifier",
    "AmqpPublisher",
    "AmqpSubscriber",
    "LoopPublisher",
    "amqp_queue_name",
    "quiet_library_loggers",
    "safe_url",
]
