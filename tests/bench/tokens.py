"""A tokenizer whose tokens are characters, for the bench's workloads without a model:
``encode`` and ``decode`` as transformers' tokenizers, with exact counts."""

from __future__ import annotations

__all__ = ["TOKENIZER", "CharTokenizer"]


class CharTokenizer:
    """One token per character."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


TOKENIZER = CharTokenizer()
