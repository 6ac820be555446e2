"""json.dumps and json.loads for what the client sends and reads, from the C half of the json package
(the _json extension) alone: importing json compiles its regular expressions (the re module), which
costs a fresh `gpuquota submit` more than its request. Same text out and same values in as json's
defaults (the same C scanner and string encoder); anything outside the plain cases goes to json itself,
which decides (and raises its own errors)."""

from __future__ import annotations

import _json


class _NotPlain(Exception):
    pass


def _dump(value) -> str:
    kind = type(value)
    if kind is str:
        return _json.encode_basestring_ascii(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if kind is int:
        return int.__repr__(value)
    if kind is list or kind is tuple:
        return "[" + ", ".join([_dump(v) for v in value]) + "]"
    if kind is dict:
        parts = []
        for k, v in value.items():
            if type(k) is not str:
                raise _NotPlain
            parts.append(_json.encode_basestring_ascii(k) + ": " + _dump(v))
        return "{" + ", ".join(parts) + "}"
    raise _NotPlain  # floats (NaN, Infinity), subclasses, anything else: json's own rules


def dumps(value) -> str:
    """json.dumps(value) (default arguments)."""
    try:
        return _dump(value)
    except (_NotPlain, RecursionError):
        import json

        return json.dumps(value)


class _Context:
    """What json.JSONDecoder() gives the C scanner."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan = _json.make_scanner(_Context())
_SPACE = " \t\n\r"


def loads(data):
    """json.loads(data)."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        if type(text) is str and not text.startswith("\ufeff"):
            start = len(text) - len(text.lstrip(_SPACE))
            value, end = _scan(text, start)
            if not text[end:].strip(_SPACE):
                return value
    except Exception:  # noqa: BLE001 - json.loads below gives the answer, or its own error
        pass
    import json

    return json.loads(data)
