"""The tool a turn calls, read from the turn's own output (vLLM's scheduler side).

A turn that ends in a tool call names its tool in the model's output; the daemon learns
pauses per tool, so the connector sends that name as ``prepare_store``'s ``tool`` when the
client named none (``agentpark.connectors.scheduler``). Clients that never say which tool
they run get learned per-tool pauses too.

The scheduler side has the request's output token ids, not its text: the tail of them
(:data:`TAIL_TOKENS`) is decoded with the model's tokenizer (loaded once, on the first
turn that needs it, by vLLM's own loader from the model config) keeping special tokens,
and the chat template's tool-call markers are looked for, as vLLM's ``--tool-call-parser``
of the same name writes them (:data:`FORMATS`, kv_connector_extra_config
``tool_call_format``):

- ``hermes`` (Qwen, Hermes, agentpark make-model): ``<tool_call>{"name": ...}</tool_call>``
- ``mistral``: ``[TOOL_CALLS]name[ARGS]{...}`` (v11+) or ``[TOOL_CALLS][{"name": ...}]``
- ``llama3_json``: ``<|python_tag|>{"name": ...}`` or an output that is only
  ``{"name": ..., "parameters"|"arguments": ...}`` (several joined by ``;``)
- ``auto`` (the default): the first of those that finds a call; ``none``: never read.

Bounded: a few hundred tokens decoded per turn, a name of at most 128 characters that the
control protocol accepts (``TOOL_RE``) else none. A marker whose call does not parse
(malformed JSON, no name) gives no tool and says why (counted ``tool_call_invalid`` once
per request by the caller). With several calls in a turn the last one is the tool. Light:
no vLLM, torch or transformers at import; vLLM's tokenizer loader is imported when first
needed, inside vLLM's process.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentpark.connectors.protocol import TOOL_RE

if TYPE_CHECKING:
    from vllm.config import VllmConfig

__all__ = [
    "FORMATS",
    "TAIL_TOKENS",
    "Found",
    "ToolCallReader",
    "find_tool",
    "reader_from_config",
]

log = logging.getLogger("vllm.agentpark")

FORMATS = ("auto", "hermes", "mistral", "llama3_json", "none")
"""``tool_call_format`` values, named after vLLM's ``--tool-call-parser`` ones."""
TAIL_TOKENS = 384
"""Output tokens decoded per turn: a tool call's name and arguments, not a whole essay."""

_HERMES = "<tool_call>"
_MISTRAL = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"
_PYTHON_TAG = "<|python_tag|>"
_NAME_RE = re.compile(r"\s*([^\s\[\]{}]{1,129})\s*(?:\[ARGS\]|\{)")
_DECODER = json.JSONDecoder()


class Tokenizer(Protocol):
    """What is used of a tokenizer (transformers' or vLLM's)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class Found:
    """A turn's tool (None: no call, or a call that did not parse: ``invalid`` says why)."""

    tool: str | None = None
    invalid: str | None = None


def _name(obj: object) -> Found:
    """A parsed call's name, checked against the control protocol's bound."""
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str):
        return Found(invalid="a tool call with no string name")
    if not TOOL_RE.match(name):
        return Found(invalid=f"tool name {name[:48]!r} is not 1-128 letters, digits or ._:/-")
    return Found(name)


def _json_at(text: str, start: int) -> tuple[object, int] | None:
    """The JSON value at ``text[start:]`` (leading whitespace skipped) and its end."""
    while start < len(text) and text[start].isspace():
        start += 1
    try:
        return _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return None


def _hermes(text: str) -> Found | None:
    at = text.rfind(_HERMES)
    if at < 0:
        return None
    parsed = _json_at(text, at + len(_HERMES))
    if parsed is None:
        return Found(invalid="<tool_call> not followed by a JSON object")
    return _name(parsed[0])


def _mistral(text: str) -> Found | None:
    at = text.rfind(_MISTRAL)
    if at < 0:
        return None
    rest = at + len(_MISTRAL)
    parsed = _json_at(text, rest)
    if parsed is not None:  # pre-v11: [TOOL_CALLS][{"name": ...}, ...]
        calls = parsed[0]
        if isinstance(calls, list) and calls:
            return _name(calls[-1])
        return _name(calls)
    named = _NAME_RE.match(text, rest)  # v11+: [TOOL_CALLS]name[ARGS]{...}
    if named is None:
        return Found(invalid="[TOOL_CALLS] not followed by a name or a JSON list")
    body = named.end() - (1 if text[named.end() - 1] == "{" else 0)
    if _json_at(text, body) is None:
        return Found(invalid="[TOOL_CALLS] name not followed by JSON arguments")
    return _name({"name": named.group(1)})


def _llama3(text: str) -> Found | None:
    at = text.rfind(_PYTHON_TAG)
    body = text[at + len(_PYTHON_TAG) :] if at >= 0 else text
    stripped = body.strip()
    if not stripped.startswith("{"):
        return Found(invalid="<|python_tag|> not followed by a JSON object") if at >= 0 else None
    last: Found | None = None
    pos = body.index("{")
    while pos < len(body) and body[pos] == "{":  # {...}; {...}: the last call is the tool
        parsed = _json_at(body, pos)
        if parsed is None:
            return Found(invalid="a JSON tool call that does not parse") if at >= 0 else last
        obj, pos = parsed
        if not (isinstance(obj, dict) and ("arguments" in obj or "parameters" in obj)):
            return Found(invalid="a JSON tool call with no arguments") if at >= 0 else last
        last = _name(obj)
        while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
            pos += 1
    return last


_FINDERS: dict[str, Callable[[str], Found | None]] = {
    "hermes": _hermes,
    "mistral": _mistral,
    "llama3_json": _llama3,
}


def find_tool(text: str, fmt: str = "auto") -> Found:
    """The tool the decoded tail of a turn calls, in format ``fmt`` (:data:`FORMATS`)."""
    if fmt == "none":
        return Found()
    order = list(_FINDERS) if fmt == "auto" else [fmt]
    first_invalid: Found | None = None
    for name in order:
        found = _FINDERS[name](text)
        if found is None:
            continue
        if found.tool is not None:
            return found
        first_invalid = first_invalid or found
    return first_invalid or Found()


class ToolCallReader:
    """Decodes a finished request's output tail and finds its tool (the tokenizer once).

    ``load`` makes the tokenizer on first use; when it fails the reader says so once and
    reads nothing after (the turn is parked as without a tool name).
    """

    def __init__(
        self,
        fmt: str,
        load: Callable[[], Tokenizer | None],
        *,
        tail_tokens: int = TAIL_TOKENS,
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"tool_call_format {fmt!r} is not one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.tail_tokens = tail_tokens
        self._load: Callable[[], Tokenizer | None] | None = load
        self._tokenizer: Tokenizer | None = None
        self.off_why: str | None = "tool_call_format is none" if fmt == "none" else None

    def _get_tokenizer(self) -> Tokenizer | None:
        if self._tokenizer is None and self._load is not None and self.off_why is None:
            load, self._load = self._load, None
            try:
                self._tokenizer = load()
            except Exception as exc:  # any loader failure: vLLM goes on, no tool names
                self._tokenizer = None
                why = f"{type(exc).__name__}: {exc}"[:200]
                self.off_why = f"the tokenizer could not be loaded ({why})"
            else:
                if self._tokenizer is None:
                    self.off_why = "vLLM runs without a tokenizer (skip_tokenizer_init)"
            if self.off_why is not None:
                log.warning("agentpark: tools not read from turns' output: %s", self.off_why)
        return self._tokenizer

    def read(self, output_token_ids: Sequence[int]) -> Found:
        """The tool of a turn whose output is these token ids (only the tail is decoded)."""
        if not output_token_ids or self.off_why is not None:
            return Found()
        tokenizer = self._get_tokenizer()
        if tokenizer is None:
            return Found()
        tail = [int(t) for t in list(output_token_ids)[-self.tail_tokens :]]
        try:
            text = tokenizer.decode(tail, skip_special_tokens=False)
        except Exception as exc:  # a tokenizer's error must not reach vLLM's scheduler
            return Found(invalid=f"the output did not decode ({type(exc).__name__})")
        return find_tool(text, self.fmt)

    def tool_of(self, request: Any) -> Found:
        """A vLLM ``Request``'s tool, from its ``output_token_ids``."""
        return self.read(getattr(request, "output_token_ids", None) or ())

    def tool_for(self, request: Any, degraded: Callable[[str, str], None]) -> str | None:
        """The tool to send for a finished request; a call that did not parse is counted
        (``tool_call_invalid``, once: vLLM finishes a request once) and gives none."""
        found = self.tool_of(request)
        if found.invalid is not None:
            rid = str(getattr(request, "request_id", "?"))[:64]
            degraded("tool_call_invalid", f"request {rid}: {found.invalid}")
        return found.tool


def tokenizer_from_path(path: str) -> Callable[[], Tokenizer]:
    """A loader of a local tokenizer with transformers (imported when called)."""

    def load() -> Tokenizer:
        from transformers import AutoTokenizer

        tokenizer: Tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return tokenizer

    return load


def reader_from_config(vllm_config: VllmConfig, extra: dict[str, Any]) -> ToolCallReader:
    """The reader vLLM's connector uses: ``tool_call_format`` from its extra config (a
    bad value is logged and read as ``auto``), the tokenizer by vLLM's own loader."""
    fmt = str(extra.get("tool_call_format", "auto"))
    if fmt not in FORMATS:
        log.warning("agentpark: tool_call_format %r is not one of %s: auto is used", fmt, FORMATS)
        fmt = "auto"
    model_config = vllm_config.model_config

    def load() -> Tokenizer | None:
        from vllm.tokenizers.registry import cached_tokenizer_from_config

        tokenizer: Tokenizer | None = cached_tokenizer_from_config(model_config)
        return tokenizer

    return ToolCallReader(fmt, load)
