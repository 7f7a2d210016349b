import json

import pytest

from txtasks import PayloadError
from txtasks.payload import headers_encode, json_decode, payload_decode, payload_encode
from txtasks.types import BYTES_CONTENT_TYPE, JSON_CONTENT_TYPE


def test_json_round_trip() -> None:
    value = {"a": [1, 2.5, None, True], "ü": "ß"}
    data, kind = payload_encode(value)
    assert kind == JSON_CONTENT_TYPE
    assert payload_decode(data, kind) == value


def test_bytes_are_stored_as_given() -> None:
    data, kind = payload_encode(b"\x00\xff")
    assert (data, kind) == (b"\x00\xff", BYTES_CONTENT_TYPE)
    assert payload_decode(data, kind) == b"\x00\xff"


@pytest.mark.parametrize("value", [object(), {1, 2}, float("nan"), {"d": b"x"}])
def test_not_json_is_refused_before_anything_is_written(value: object) -> None:
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        payload_encode(value)


def test_oversized_payload_names_the_limit() -> None:
    with pytest.raises(PayloadError, match="over the limit of 10 bytes"):
        payload_encode("x" * 20, limit=10)


def test_undecodable_payload() -> None:
    with pytest.raises(PayloadError, match="not valid JSON"):
        payload_decode(b"{nope", JSON_CONTENT_TYPE)
    with pytest.raises(PayloadError, match="content type"):
        payload_decode(b"x", "application/pickle")


@pytest.mark.parametrize(
    "text",
    [
        "null", "1", "-2.5e3", '"x"', '{"a":[1,{"b":null}]}', "[]",  # as txtasks writes them
        ' {"a": 1}', '{"a": 1}\n', "\t[1, 2] ", "\ufeff{}",  # whitespace, a BOM
        "{nope", "[1] [2]", "1 x", "", "   ", "NaN", "[1,]", '"unterminated',  # not JSON
    ],
)  # fmt: skip
def test_json_decode_is_json_loads(text: str) -> None:
    """The same value as json.loads, or the same error."""
    try:
        expected: object = json.loads(text)
    except ValueError as exc:
        with pytest.raises(type(exc)) as raised:
            json_decode(text)
        assert str(raised.value) == str(exc)
    else:
        decoded = json_decode(text)
        assert repr(decoded) == repr(expected)  # NaN too


def test_headers_must_be_strings() -> None:
    assert headers_encode({"trace": "abc"}) == '{"trace":"abc"}'
    with pytest.raises(PayloadError, match="headers"):
        headers_encode({"n": 1})  # type: ignore[dict-item]
