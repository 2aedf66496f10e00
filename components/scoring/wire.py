"""Plain-data wire format between the trusted judge and the sandboxed candidate process.

Shared verbatim by both sides: the sandbox scripts are run as ``python -I -S -c <this file's
text + the script>``, so this module imports only the standard library and defines no
``__future__`` import after its first line.

Values: ``None``, ``bool``, ``int``, ``float`` (NaN and infinities included), ``str`` travel as
JSON; the other containers are one-key objects: ``{"t": [...]}`` tuple, ``{"s": [...]}`` set,
``{"f": [...]}`` frozenset, ``{"d": [[k, v], ...]}`` dict, ``{"b": "hex"}`` bytes,
``{"c": [re, im]}`` complex; a JSON array is a list. :func:`decode` builds only those builtin
types, so whatever bytes the untrusted side sends, the judge compares plain values (an object
whose ``__eq__`` always answers True cannot cross). Frames are a 4-byte big-endian length and
UTF-8 JSON, at most :data:`MAX_FRAME` bytes.
"""

import json
import os
import select
import struct
import time

MAX_FRAME = 64 << 20
MAX_DEPTH = 200
_LEN = struct.Struct(">I")


class WireError(Exception):
    """A frame or value that is not valid on the wire (too big, too deep, malformed, wrong type)."""


def encode(value, depth=0):
    """``value`` as JSON-ready data; :class:`WireError` for types the wire does not carry."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return bool(value) if isinstance(value, bool) else (None if value is None else str.__str__(value))
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    tags = ((tuple, "t"), (frozenset, "f"), (set, "s"))
    for kind, tag in tags:
        if isinstance(value, kind):
            return {tag: [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(value)]}
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).hex()}
    if isinstance(value, complex):
        return {"c": [value.real, value.imag]}
    raise WireError(f"values of type {type(value).__name__} cannot be passed (plain data only)")


def decode(data, depth=0):
    """Inverse of :func:`encode`; builds only builtin types and rejects anything else."""
    if depth > MAX_DEPTH:
        raise WireError("value nested too deeply")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is dict and len(data) == 1:
        (tag, body), = data.items()
        try:
            if tag == "t" and type(body) is list:
                return tuple(decode(v, depth + 1) for v in body)
            if tag == "s" and type(body) is list:
                return {decode(v, depth + 1) for v in body}
            if tag == "f" and type(body) is list:
                return frozenset(decode(v, depth + 1) for v in body)
            if tag == "d" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
                return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
            if tag == "b" and type(body) is str:
                return bytes.fromhex(body)
            if tag == "c" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
                return complex(body[0], body[1])
        except (TypeError, ValueError) as exc:  # unhashable set member / dict key, bad hex
            raise WireError(f"malformed {tag!r} value: {exc}") from None
    raise WireError(f"not a wire value: {str(data)[:80]!r}")


def dumps(message):
    return json.dumps(message, allow_nan=True, separators=(",", ":")).encode("utf-8")


def write_frame(fd, message, deadline=None):
    """Write one frame; with ``deadline`` (``time.monotonic()``) the fd must be non-blocking."""
    data = dumps(message)
    view = memoryview(_LEN.pack(len(data)) + data)
    while view:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [fd], [], left)[1]:
                raise TimeoutError("write timed out")
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            continue
        view = view[n:]


def _read_exact(fd, n, deadline):
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("read timed out")
        try:
            chunk = os.read(fd, min(n - got, 1 << 20))
        except BlockingIOError:
            continue
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd, deadline=None, limit=MAX_FRAME):
    """One decoded JSON message, or None at end of file; :class:`WireError` when malformed."""
    head = _read_exact(fd, _LEN.size, deadline)
    if head is None:
        return None
    size = _LEN.unpack(head)[0]
    if size > limit:
        raise WireError(f"frame of {size} bytes exceeds the {limit}-byte limit")
    body = _read_exact(fd, size, deadline)
    if body is None:
        return None
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"malformed frame: {type(exc).__name__}") from None
