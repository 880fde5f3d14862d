"""The control protocol's frames and the validation of a request's kv_transfer_params."""

from __future__ import annotations

import socket
import struct

import pytest

from agentpark.connectors.protocol import (
    Layout,
    ProtocolError,
    SessionParams,
    decode_tokens,
    encode_frame,
    encode_tokens,
    parse_params,
    read_frame,
)


def test_a_frame_round_trips_with_its_token_blob() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(encode_frame({"op": "match", "n": 3}, encode_tokens([1, 2, 70000])))
        message, blob = read_frame(b)
    assert message == {"op": "match", "n": 3}
    assert decode_tokens(blob).tolist() == [1, 2, 70000]


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack("<II", 1 << 30, 0),  # oversize
        struct.pack("<II", 3, 0) + b"[1]",  # not an object
        struct.pack("<II", 2, 0) + b"{",  # not JSON
        struct.pack("<II", 10, 0) + b"{}",  # cut short
    ],
)
def test_a_bad_frame_is_refused(raw: bytes) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(raw)
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(ProtocolError):
            read_frame(b)


def test_a_layout_with_nothing_to_copy_is_refused() -> None:
    with pytest.raises(ProtocolError):
        Layout.from_wire(
            {"model_uid": "m", "block_size": 16, "num_blocks": 4, "arrays": [], "kv_dtype": "x"}
        )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ({"other": 1}, None),
        ({"agentpark": {"session_id": "a-1"}}, SessionParams("a-1")),
        (
            {"agentpark": {"session_id": "a", "tool": "web_search", "expected_resume_s": 8}},
            SessionParams("a", "web_search", 8.0),
        ),
        ({"agentpark": {"session_id": "a", "tenant": "t"}}, SessionParams("a")),
    ],
)
def test_good_params_parse(raw: object, expected: SessionParams | None) -> None:
    assert parse_params(raw, "t") == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"agentpark": "s"}, "must be an object"),
        ({"agentpark": {"session_id": 5}}, "session_id"),
        ({"agentpark": {"session_id": "x" * 10_240}}, "session_id"),
        ({"agentpark": {"session_id": "bad id"}}, "session_id"),
        ({"agentpark": {"session_id": "a\n"}}, "session_id"),  # `$` matches before a \n
        ({"agentpark": {"session_id": "a", "tenant": "other"}}, "another tenant"),
        ({"agentpark": {"session_id": "a", "expected_resume_s": "soon"}}, "number"),
        ({"agentpark": {"session_id": "a", "expected_resume_s": True}}, "number"),
        ({"agentpark": {"session_id": "a", "expected_resume_s": -1}}, "0..86400"),
        ({"agentpark": {"session_id": "a", "tool": ["x"]}}, "tool"),
        ({"agentpark": {"session_id": "a", "sesion": 1}}, "unknown keys"),
    ],
)
def test_bad_params_are_refused_with_the_reason(raw: object, reason: str) -> None:
    refused = parse_params(raw, "t")
    assert isinstance(refused, str) and reason in refused
    assert len(refused) < 400  # a 10 KB id is not echoed back whole
