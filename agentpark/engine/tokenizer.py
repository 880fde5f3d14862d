"""Byte-level tokenizer: one token per UTF-8 byte, so any text round-trips and vocab is 256."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["VOCAB_SIZE", "decode", "encode"]

VOCAB_SIZE = 256


def encode(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids."""
    return list(text.encode("utf-8"))


def decode(tokens: Sequence[int]) -> str:
    """Text of byte tokens; invalid UTF-8 (e.g. a cut multi-byte char) becomes U+FFFD."""
    return bytes(tokens).decode("utf-8", errors="replace")
