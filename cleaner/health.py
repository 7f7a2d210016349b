"""The cleaner's health endpoint: txtasks' own (`txtasks.health`), answering every probe with
`Cleaner.health()`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from txtasks import health

log = logging.getLogger("cleaner")


class HealthServer(health.HealthServer):
    """Serves the result of `check()` (a dict with boolean "live" and "ready")."""

    def __init__(self, check: Callable[[], dict[str, Any]], host: str, port: int) -> None:
        super().__init__(lambda probe: check(), host, port, logger=log)
