"""Who may use the dashboard: authentication from the environment, the loopback rule, and the
CSRF token every POST carries."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
import secrets
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from txtasks.errors import ConfigurationError

ENV_TOKEN = "TXTASKS_DASHBOARD_TOKEN"
ENV_USER = "TXTASKS_DASHBOARD_USER"
ENV_PASSWORD = "TXTASKS_DASHBOARD_PASSWORD"
CSRF_COOKIE = "txtasks_csrf"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Auth:
    """Basic auth with one user and password, or a token: sent as `Authorization: Bearer
    TOKEN`, or as the password of basic auth (any user name), which a browser asks for."""

    user: str | None = None
    password: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if self.token is None and (not self.user or not self.password):
            raise ConfigurationError("dashboard auth: give a token, or a user and a password")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Auth | None:
        """The auth set by TXTASKS_DASHBOARD_TOKEN, or TXTASKS_DASHBOARD_USER and
        TXTASKS_DASHBOARD_PASSWORD; None when neither is set."""
        env = os.environ if environ is None else environ
        token = env.get(ENV_TOKEN) or None
        user, password = env.get(ENV_USER) or None, env.get(ENV_PASSWORD) or None
        if token is None and user is None and password is None:
            return None
        if token is None and (user is None or password is None):
            raise ConfigurationError(f"dashboard auth: set both {ENV_USER} and {ENV_PASSWORD}")
        return cls(user=user, password=password, token=token)

    def who(self, authorization: str | None) -> str | None:
        """The name of whoever sent this Authorization header, or None when it is not valid."""
        if not authorization:
            return None
        scheme, _, value = authorization.partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and self.token is not None:
            return "token" if _same(value.strip(), self.token) else None
        if scheme != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(value.strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not sep:
            return None
        if self.token is not None and _same(password, self.token):
            return f"{user or 'token'} (token)"
        if (
            self.user is not None
            and self.password is not None
            and _same(user, self.user) & _same(password, self.password)
        ):
            return user
        return None


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost: what only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: Auth | None) -> None:
    """Refuse to listen beyond this machine without authentication."""
    if auth is None and not is_loopback(host):
        raise ConfigurationError(
            f"dashboard: --host {host} is reachable from other machines; set "
            f"{ENV_TOKEN}, or {ENV_USER} and {ENV_PASSWORD}, to require a login"
        )


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_ok(cookie: str | None, field: str | None) -> bool:
    """The token of the form is the one of the cookie (double submit)."""
    return bool(cookie) and bool(field) and _same(str(field), str(cookie))


class Guard:
    """Checks every HTTP request: its Host header is one of `hosts` (when given: a page of
    another site that a DNS name it controls points at 127.0.0.1 is refused), and it carries
    the login `auth` asks for (when set). Records who made it for the action log."""

    def __init__(
        self, app: ASGIApp, auth: Auth | None, hosts: Collection[str] | None = None
    ) -> None:
        self.app, self.auth = app, auth
        self.hosts = None if hosts is None else {h.strip("[]").lower() for h in hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.hosts is not None:
            host = urlsplit("//" + headers.get(b"host", b"").decode("latin-1")).hostname
            if host not in self.hosts:
                await PlainTextResponse("unknown host", status_code=400)(scope, receive, send)
                return
        if self.auth is None:
            client = scope.get("client")
            scope["txtasks.who"] = f"anonymous@{client[0] if client else '?'}"
            await self.app(scope, receive, send)
            return
        raw = headers.get(b"authorization")
        who = self.auth.who(raw.decode("latin-1") if raw else None)
        if who is None:
            response = PlainTextResponse(
                "login required",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="txtasks", charset="UTF-8"'},
            )
            await response(scope, receive, send)
            return
        scope["txtasks.who"] = who
        await self.app(scope, receive, send)


#: The names a browser on this machine reaches a loopback dashboard by.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
