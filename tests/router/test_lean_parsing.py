"""The proxy's shortcuts on its per-request path read what the long way reads: the
request body's JSON (``front._loads`` against ``json.loads``) and an answer's checked
headers (``http_cycle._checked_name``, remembered pairs)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.router import http_cycle
from placement.router.forward import Exchange
from placement.router.front import _loads, parse_request

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


def _same(body: bytes) -> None:
    try:
        expected: object = json.loads(body)
    except ValueError as exc:
        with pytest.raises(type(exc)):
            _loads(body)
        return
    assert _loads(body) == expected


@given(st.dictionaries(st.text(), _JSON, max_size=4), st.booleans())
def test_a_body_reads_as_json_loads_reads_it(payload: dict[str, object], ascii_only: bool) -> None:
    _same(json.dumps(payload, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@given(st.binary(max_size=24))
def test_any_bytes_read_or_fail_as_json_loads_does(tail: bytes) -> None:
    _same(b"{" + tail)
    _same(tail)


@pytest.mark.parametrize(
    "body",
    [
        '{"model": "a-1"}'.encode("utf-16"),  # a BOM, then UTF-16
        '{"model": "a-1"}'.encode("utf-16-le"),  # "{" then a zero byte
        '{"model": "a-1"}'.encode("utf-32-le"),
        b'\xef\xbb\xbf{"model": "a-1"}',  # UTF-8's BOM: json.loads reads it
        b'{"model": "a-\xed\xa0\x80"}',  # an encoded lone surrogate: json.loads passes it
        b'{"model": "a-\xff"}',  # not UTF-8 at all
        b'{"prompt": "\\"model\\": \\"b\\"", "model": "a-1"}',  # escaped quotes
        b'{"messages": [{"model": "b"}], "model": "a-1"}',  # "model" inside another field
        b'{"model": "a-1"} x',  # extra data
        b"{",
        b"{}",
    ],
)
def test_bodies_json_loads_reads_its_own_way(body: bytes) -> None:
    _same(body)


def test_the_model_is_the_top_level_field_whatever_else_names_one() -> None:
    exchange = Exchange(started_s=0.0, arrived_s=0.0, path="/v1/completions")
    exchange.body = (
        b'{"messages": [{"model": "b"}], "prompt": "\\"model\\": \\"c\\"", "model": "a-1"}'
    )
    assert parse_request(exchange, [], max_depth=8, base_models=()) is None
    assert exchange.model == "a-1"


def test_a_utf16_request_is_refused_or_read_as_before() -> None:
    exchange = Exchange(started_s=0.0, arrived_s=0.0, path="/v1/completions")
    exchange.body = '{"model": "a-1"}'.encode("utf-16-le")
    assert parse_request(exchange, [], max_depth=8, base_models=()) is None
    assert exchange.model == "a-1"


def test_a_checked_header_is_remembered_and_a_bad_one_still_refused() -> None:
    pair = (b"Content-Type", b"application/json")
    assert http_cycle._checked_name(pair, *pair) == b"content-type"
    assert http_cycle._CHECKED[pair] == b"content-type"
    assert http_cycle._checked_name(pair, *pair) == b"content-type"
    for bad in [(b"content-type", b"a\r\nx-injected: 1"), (b"bad name", b"x")]:
        with pytest.raises(RuntimeError):
            http_cycle._checked_name(bad, *bad)
        assert bad not in http_cycle._CHECKED
    listed = [b"X-A", b"b"]  # ASGI allows lists: checked, not remembered
    assert http_cycle._checked_name(listed, b"X-A", b"b") == b"x-a"


def test_the_remembered_headers_stay_bounded() -> None:
    for i in range(http_cycle._CHECKED_MAX + 10):
        pair = (b"date", b"%d" % i)
        http_cycle._checked_name(pair, *pair)
    assert len(http_cycle._CHECKED) <= http_cycle._CHECKED_MAX
