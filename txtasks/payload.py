"""Payload encoding: JSON (never pickle), or bytes the application encodes itself."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from txtasks.errors import PayloadError
from txtasks.types import BYTES_CONTENT_TYPE, JSON_CONTENT_TYPE

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
#: One encoder for every payload (json.dumps with options builds a new one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
#: json's own scanner (C), without the layers of `json.loads` around it (five times faster on a
#: small payload, which the worker decodes for every task).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def payload_encode(payload: Any, *, limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> tuple[bytes, str]:
    """Encode a payload for storage; raise PayloadError before anything is written."""
    if isinstance(payload, bytes | bytearray | memoryview):
        data, content_type = bytes(payload), BYTES_CONTENT_TYPE
    else:
        try:
            text = _ENCODER.encode(payload)
        except RecursionError as exc:
            raise PayloadError(
                "payload is not JSON-serialisable: nested too deeply (or it contains itself)"
            ) from exc
        except Exception as exc:  # TypeError, ValueError (NaN), OverflowError, a bad __iter__...
            detail = str(exc) or type(exc).__name__
            raise PayloadError(f"payload is not JSON-serialisable: {detail}") from exc
        data, content_type = text.encode("utf-8"), JSON_CONTENT_TYPE
    if len(data) > limit:
        raise PayloadError(
            f"payload is {len(data)} bytes, over the limit of {limit} bytes (max_payload_bytes)"
        )
    return data, content_type


def result_encode(value: Any, *, limit: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """A handler's return value as JSON text for the archive; PayloadError when it is not
    JSON-serialisable or is over `limit` bytes (the application's `max_payload_bytes`)."""
    try:
        text = _ENCODER.encode(value)
    except RecursionError as exc:
        raise PayloadError("result is not JSON-serialisable: nested too deeply") from exc
    except Exception as exc:
        detail = str(exc) or type(exc).__name__
        raise PayloadError(f"result is not JSON-serialisable: {detail}") from exc
    size = len(text.encode("utf-8"))
    if size > limit:
        raise PayloadError(
            f"result is {size} bytes, over the limit of {limit} bytes (max_payload_bytes)"
        )
    return text


def payload_decode(data: bytes, content_type: str) -> Any:
    """Decode a stored payload; raise PayloadError naming what was wrong."""
    if content_type == BYTES_CONTENT_TYPE:
        return data
    if content_type != JSON_CONTENT_TYPE:
        raise PayloadError(f"unknown payload content type {content_type!r}")
    try:
        return json_decode(data.decode("utf-8"))
    except RecursionError as exc:
        raise PayloadError("payload is not valid JSON: nested too deeply to decode") from exc
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise PayloadError(f"payload is not valid JSON: {exc}") from exc


def json_decode(text: str) -> Any:
    """`json.loads(text)`: the scanner alone for a document with no whitespace around it (as
    txtasks writes them); anything else, and every error, goes through `json.loads`."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:  # leading whitespace or a BOM, or not JSON at all
        return json.loads(text)
    if end != len(text):  # trailing whitespace, or extra data
        return json.loads(text)
    return value


def headers_encode(headers: dict[str, str] | None) -> str | None:
    """Headers are a flat str -> str mapping stored as JSON text."""
    if not headers:
        return None
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise PayloadError(f"headers must map str to str, got {key!r}: {value!r}")
        if "\x00" in key or "\x00" in value:
            raise PayloadError(f"headers must not contain NUL characters: {key!r}")
    return json.dumps(headers, separators=(",", ":"), ensure_ascii=False)


def headers_decode(text: str | None) -> dict[str, str]:
    """Stored headers; a ValueError (PayloadError among them) when they are not JSON."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise PayloadError("headers are not valid JSON: nested too deeply to decode") from exc
    return value if isinstance(value, dict) else {}
