"""The header of a tier file: magic, format version, JSON length, then the JSON itself.

The header region is at least 4 KiB and grows in 4 KiB steps with the layout it names (a
model with 256 KV arrays needs about 16 KiB), so no layout is refused for its size. The
pool arrays start right after it; readers take their offsets from the tier (or, in vLLM's
worker, from the ``register`` answer), never from a constant.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MAGIC",
    "encode_header",
    "header_bytes",
    "read_header",
    "read_header_fd",
    "record_owner",
]

MAGIC = b"AGPKTIER"
FORMAT_VERSION = 1
HEADER_BYTES = 4096  # the smallest header region (all a small layout needs)
ALIGN = 4096
_PREFIX = struct.Struct("<8sII")
# Room for the fields written at creation beside the layout (``created_at``).
_SLACK = 64
# A header longer than this is not one of ours (read_header never buffers more).
_MAX_BODY = 16 << 20


def align(n: int) -> int:
    """``n`` rounded up to the next 4 KiB."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def header_bytes(fields: dict[str, Any]) -> int:
    """The header region for ``fields`` (the layout and its owner): 4 KiB or more."""
    body = len(json.dumps(fields).encode())
    return max(HEADER_BYTES, align(_PREFIX.size + body + _SLACK))


def encode_header(fields: dict[str, Any], region: int) -> bytes:
    """The header bytes; ValueError when they do not fit in ``region``."""
    body = json.dumps(fields).encode()
    raw = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(body)) + body
    if len(raw) > region:
        raise ValueError(f"header is {len(raw)} bytes, its region {region}")
    return raw


def read_header_fd(fd: int) -> dict[str, Any]:
    """The header of the open tier file ``fd``; ValueError naming what is wrong."""
    prefix = os.pread(fd, _PREFIX.size, 0)
    if len(prefix) < _PREFIX.size:
        raise ValueError(f"file is {len(prefix)} bytes, shorter than a header")
    magic, version, length = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ValueError(f"magic is {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise ValueError(f"format version is {version}, this daemon reads {FORMAT_VERSION}")
    if length > _MAX_BODY:
        raise ValueError(f"header claims {length} bytes")
    body = os.pread(fd, length, _PREFIX.size)
    if len(body) < length:
        raise ValueError("header is cut short")
    header = json.loads(body)
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header["version"] = version
    return header


def read_header(path: Path) -> dict[str, Any]:
    """The header of the tier file at ``path``; ValueError naming what is wrong with it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_header_fd(fd)
    finally:
        os.close(fd)


def record_owner(fd: int, fields: dict[str, Any], region: int) -> bool:
    """Write ``fields`` (the layout and ``state_dir``, the owner) over a re-attached file's
    header that names no owner or another one, keeping its ``created_at`` (part of the
    pool id a worker knows). An older daemon's file then names the daemon that holds it,
    so ``agentpark db cleanup`` can say whose it is. False when nothing was written (it
    named this owner already, or the fields do not fit in the file's header region)."""
    header = read_header_fd(fd)
    if header.get("state_dir") == fields.get("state_dir"):
        return False
    try:
        raw = encode_header({**fields, "created_at": header.get("created_at")}, region)
    except ValueError:
        return False
    os.pwrite(fd, raw, 0)
    return True
