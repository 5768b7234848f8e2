"""Secrets out of every message: the one scrubber of responses, log lines, XCom values,
trigger events and errors (the hook's `SparkpointHook.scrub`, the S3 client's errors, the
UI's 502, the CLI's error line all end here).

What is removed:

* every secret this process was handed: a store's S3 credentials (`S3Storage` registers
  them when it is made), a connection's password, extras and the credentials an ``aws``
  connection yielded (the hook registers them when it resolves; a hook made later for
  the same connection, say to scrub an error, knows them too) (`register`);
* the secrets a caller passes (`scrub`'s `secrets`);
* any ``user:password@`` before a host, with a scheme (``s3://key:secret@bucket``,
  ``http://u@host``) or without one (``key:secret@bucket`` in a message that quotes a
  bucket name): `userinfo` finds it in a URI, `scrub` in free text.

A secret shorter than `MIN_SECRET_CHARS` (`REGISTERED_MIN_CHARS` for one registered for
the whole process: AWS keys are 20 and 40 characters) is not replaced in free text (it
would mangle every message), but a URL's user info always is. Pure Python: no Airflow,
no boto3.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["MASK", "MIN_SECRET_CHARS", "REGISTERED_MIN_CHARS", "redact_url", "register", "scrub",
           "scrub_value", "secret_values", "userinfo"]

MASK = "***"
#: the shortest secret a caller passes that is replaced wherever it appears in a message
MIN_SECRET_CHARS = 4
#: the shortest registered secret (`register`) replaced in every message of the process
REGISTERED_MIN_CHARS = 8
#: secrets registered at most (a process holds a few connections' worth)
_REGISTERED_MAX = 4096

# ``scheme://user[:password]@``: everything between "//" and "@" that is not a path
_SCHEMED = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"<>]+@")
# ``user:password@host`` without a scheme: a colon before the "@" marks the password (an
# e-mail address has none); the host must follow
_BARE = re.compile(r"(?<![\w.+/:@-])[\w.~%!$&*+=-]+:[^\s/@'\"<>]*@(?=[\w\[])")

_lock = threading.Lock()
_registered: set[str] = set()


def register(*values: Any) -> None:
    """Remember secrets of this process (each string value, its ``user:password`` parts
    when it is a URI with some): every later `scrub` removes them."""
    found = [str(v) for v in values if v is not None and not isinstance(v, bool)]
    found += [part for v in found for part in userinfo(v)]
    with _lock:
        for value in found:
            if len(value) >= REGISTERED_MIN_CHARS and len(_registered) < _REGISTERED_MAX:
                _registered.add(value)


def userinfo(uri: Any) -> list[str]:
    """The ``user:password`` of `uri` (with or without a scheme) and its parts; empty when
    it has none."""
    if not isinstance(uri, str) or "@" not in uri:
        return []
    text = uri.strip()
    rest = text.split("://", 1)[1] if "://" in text else text
    info, at, _host = rest.partition("@")
    if not at or not info:
        return []
    if "/" in info and ":" not in info.split("/", 1)[0]:
        return []  # an "@" in a path (s3://bucket/file@2x.png): no user info
    if "://" not in text and ":" not in info:
        return []  # without a scheme, "name@host" is an address, not credentials
    return [part for part in (info, *info.split(":", 1)) if part]


def secret_values(value: Any, plain: Iterable[str] = ()) -> list[str]:
    """Every string or number nested in `value` (a connection's extra), but the values of
    the keys in `plain` at its top level: what a scrub of that connection removes."""
    skip = set(plain)
    found: list[str] = []
    stack: list[Any] = ([v for k, v in value.items() if k not in skip] if isinstance(value, Mapping)
                        else [value])
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            stack.extend(item)
        elif isinstance(item, (str, int, float)) and not isinstance(item, bool):
            found.append(str(item))
            found += userinfo(item)
    return found


def scrub(text: str, secrets: Iterable[Any] = ()) -> str:
    """`text` without the registered secrets, `secrets` (`MIN_SECRET_CHARS` or longer;
    each replaced by ``***``) and any ``user:password@`` before a host."""
    with _lock:
        known = set(_registered)
    known.update(str(s) for s in secrets
                 if s is not None and not isinstance(s, bool) and len(str(s)) >= MIN_SECRET_CHARS)
    text = _BARE.sub("", _SCHEMED.sub(r"\1", text))  # first: a masked password would hide its "user:"
    for secret in sorted(known, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def scrub_value(value: Any, secrets: Iterable[Any] = ()) -> Any:
    """`value` (a JSON-like XCom value, event or response) with every string in it scrubbed."""
    secrets = list(secrets)
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, Mapping):
        return {k: scrub_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_value(v, secrets) for v in value]
    if isinstance(value, tuple):
        return tuple(scrub_value(v, secrets) for v in value)
    return value


def redact_url(url: str) -> str:
    """`url` without any ``user:password@`` part."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a malformed host or port: nothing of it is shown
        return "<invalid endpoint>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{port}" if port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
