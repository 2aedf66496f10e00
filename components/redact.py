"""Remove credentials from URIs in any text before it is logged, stored or shown.

``scheme://user:password@host/...`` keeps the user and replaces the password with ``***``. The
password may contain ``/``, ``@`` and ``:`` (users paste them unencoded): everything between the
first ``:`` of the user-info and the *last* ``@`` of the URI is the password, so an ``@`` in a
path or query is redacted too (safe side). Query parameters with secret-looking names
(``password``, ``token``, ``access_token``, ``api_key``, ``secret``, ``sig`` ...) get ``***`` as well.
A URI ends at whitespace, a quote, ``<``/``>``, or ``,``/``)``/``]`` followed by whitespace.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***"
_URI = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<rest>[^\s'\"<>]+?)(?=[,)\]]?(?:[\s'\"<>]|$))")
_SECRET_NAMES = ("password", "passwd", "pwd", "pass", "token", "access_token", "refresh_token", "id_token",
                 "api_key", "api-key", "apikey", "key", "secret", "client_secret", "sig", "signature", "auth",
                 "credential", "sslpassword")
_SECRET_PARAM = re.compile(rf"(?i)([?&;](?:{'|'.join(map(re.escape, _SECRET_NAMES))})=)[^&#;\s'\"]*")


def _one(match: re.Match[str]) -> str:
    scheme, rest = match.group("scheme"), match.group("rest")
    at = rest.rfind("@")
    if at > 0:
        userinfo, host = rest[:at], rest[at + 1:]
        user, sep, _password = userinfo.partition(":")
        rest = f"{user}:{MASK}@{host}" if sep else f"{userinfo}@{host}"
    return scheme + _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, rest)


def redact(text: str) -> str:
    """``text`` with every URI password and secret query parameter replaced by ``***``."""
    if "://" not in text and "=" not in text:
        return text
    return _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, _URI.sub(_one, text))


def redact_value(value: Any) -> Any:
    """:func:`redact` applied to every string in ``value`` (dicts, lists and tuples walked)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value


def _any_case(word: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


SECRET_FREE_PATTERN = (
    "^(?!-- no password or token in a parameter: give the worker MLFLOW_TRACKING_USERNAME and "
    "MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN --)"
    r"(?![\s\S]*://[^\s'\"<>]*:[^\s'\"<>]*@)"
    rf"(?![\s\S]*[?&;](?:{'|'.join(_any_case(n) for n in _SECRET_NAMES)})=)"
)
"""A JSON-schema ``pattern`` (ECMA and Python ``re`` alike: no inline flags) that a string matches
only when :func:`redact` would leave it alone -- no ``scheme://user:password@`` and no secret
query parameter -- or refuses a little more (a ``://`` without a scheme). The Prefect server
checks deployment-run parameters against it before storing them (``flows/secret_params.py``); the
first lookahead never matches and is there so the server's "does not match" error says what to do."""
