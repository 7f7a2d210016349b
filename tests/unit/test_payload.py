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


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def cyclic() -> object:
    value: list[object] = []
    value.append(value)
    return value


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (nested(100_000), "nested too deeply"),
        (cyclic(), "Circular reference"),
        ({"big": 10**5000}, "not JSON-serialisable"),  # int -> str conversion limit
        (float("inf"), "Out of range float"),
        ({("a",): 1}, "keys must be"),
    ],
    ids=["deep", "cyclic", "huge int", "infinity", "tuple key"],
)
def test_every_encoding_error_is_a_payload_error(value: object, words: str) -> None:
    with pytest.raises(PayloadError, match="not JSON-serialisable") as info:
        payload_encode(value)
    assert words in str(info.value)


def test_deeply_nested_stored_payload_is_a_decode_error() -> None:
    data = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(PayloadError, match="not valid JSON: nested too deeply"):
        payload_decode(data, JSON_CONTENT_TYPE)
    with pytest.raises(PayloadError, match="nested too deeply"):
        payload_decode(b" " + data, JSON_CONTENT_TYPE)  # the json.loads path
