"""Wake-ups: a hint sent after commit so an idle worker claims at once instead of at its next poll.

The row is the truth; a wake-up only saves latency. Losing one delays a task, never loses it.

`base` holds the notifier protocol and the message format, `commit` sends hints after the
caller's transaction commits, and `amqp` is the RabbitMQ transport (publisher, subscriber),
imported only when a broker URL asks for it.
"""

from txtasks.errors import ConfigurationError
from txtasks.wakeup.base import (
    Notifier,
    NullNotifier,
    Wakeup,
    WakeupStats,
    wakeup_decode,
    wakeup_encode,
    wakeup_read,
)
from txtasks.wakeup.commit import wakeup_after_commit


def notifier_for_url(url: str | None) -> Notifier:
    """An AMQP notifier for amqp:// or amqps:// URLs; the null one for None."""
    if not url:
        return NullNotifier()
    if not url.startswith(("amqp://", "amqps://")):
        raise ConfigurationError(
            f"broker_url: {url.split('@')[-1]!r} is not an amqp:// or amqps:// URL"
        )
    try:
        from txtasks.wakeup.amqp import AmqpNotifier
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(
            "broker_url: RabbitMQ wake-ups need aio-pika: pip install 'txtasks[rabbitmq]'"
        ) from exc
    return AmqpNotifier(url)


__all__ = [
    "Notifier",
    "NullNotifier",
    "Wakeup",
    "WakeupStats",
    "notifier_for_url",
    "wakeup_after_commit",
    "wakeup_decode",
    "wakeup_encode",
    "wakeup_read",
]
