"""The environment variables that name txtasks' servers, read by the App and every command."""

from __future__ import annotations

#: The database URL, when `App(database_url=...)` and `--database-url` are not given.
ENV_DATABASE_URL = "TXTASKS_DATABASE_URL"
#: The RabbitMQ URL for wake-ups, when `App(broker_url=...)` and `--broker-url` are not given.
ENV_BROKER_URL = "TXTASKS_BROKER_URL"
