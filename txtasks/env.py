"""The environment variables that name txtasks' servers, read by the App and every command.

Precedence: a command-line flag beats everything; then what the code passes explicitly
(``App(database_url=...)``); then the environment. When the code and the environment both
name a server and differ, one line is logged saying which is used: a database or broker is
never switched silently.
"""

from __future__ import annotations

import logging
import os
import re

#: The database URL, when `App(database_url=...)` and `--database-url` are not given.
ENV_DATABASE_URL = "TXTASKS_DATABASE_URL"
#: The RabbitMQ URL for wake-ups, when `App(broker_url=...)` and `--broker-url` are not given.
ENV_BROKER_URL = "TXTASKS_BROKER_URL"

log = logging.getLogger("txtasks")
_PASSWORD = re.compile(r"(//[^:/@]*:)[^@/]*@")
_told: set[tuple[str, str, str]] = set()


def url_hidden(url: str) -> str:
    """For logs: the URL with its password hidden."""
    return _PASSWORD.sub(r"\1***@", url)


def code_or_env(setting: str, given: str | None, variable: str) -> str | None:
    """`given` (set in code), else the environment's `variable`; one line logged (once per
    pair) when both are set and differ."""
    from_env = os.environ.get(variable) or None
    if given and from_env and given != from_env and (setting, given, from_env) not in _told:
        _told.add((setting, given, from_env))
        log.warning(
            "%s: %s given in code is used, not %s=%s (the code beats the environment; "
            "pass the command's flag or leave it out of the code to use the variable)",
            setting, url_hidden(given), variable, url_hidden(from_env),
        )  # fmt: skip
    return given or from_env
