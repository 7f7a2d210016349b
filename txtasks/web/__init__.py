"""The web dashboard (extra `web`): `txtasks dashboard APP`, or `create_app(app)` mounted in
an ASGI application of yours. See docs/dashboard.md."""

from __future__ import annotations

from txtasks.errors import extras_needed

with extras_needed():  # the extra `web`: a clear error naming it when it is not installed
    from txtasks.web.app import create_app
    from txtasks.web.security import Auth

__all__ = ["Auth", "create_app"]
