"""Bounded reads of stored records: the one reader and decoder of every JSON record
Sparkpoint keeps in a shared place (the checkpoint store, a sink's output location, a
replay record carried by a sink).

Whoever can write such a place can plant any bytes where a record is read, so a record
is bounded three ways before it becomes a Python object (`Limits`, one per kind of
record: `checkpoints.layout.limits_of` for a job's keys, the sinks' own for claims):

* **bytes**: an object over ``max_bytes`` is never read whole (`Storage.get`);
* **cost**: what the parsed object would take in memory, estimated from a count of its
  tokens before parsing (`parse_cost`, an upper bound: a 3-byte ``{}`` becomes a 64-byte
  dict, so parsed JSON can take ~25 times its size), is at most ``max_cost``;
* **depth**: containers nest at most ``max_depth`` deep (Python's parser and every
  recursive walk of the object would otherwise hit the recursion limit).

Over a limit, not JSON, or refused by the record's own parser: the record is corrupt
(`CorruptRecord`, naming its path), never a crash, a hang or an out-of-memory. Writers
check what they write against the same limits (`check_writable`), so a record a
Sparkpoint writer produced is always one its readers accept.

Pure Python over a `Storage`: no Spark, no Airflow.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from airflow_sparkpoint.exceptions import (
    CatalogError,
    CorruptMetadata,
    CorruptRecord,
    ObjectTooLarge,
    StorageError,
)
from airflow_sparkpoint.storage.base import Storage

__all__ = ["MAX_DEPTH", "Limits", "check_writable", "clip", "decode", "json_object", "parse_cost",
           "read_record", "read_record_or_warn"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_KIB, _MIB = 1024, 1024 * 1024
#: how deep a record's containers may nest (Sparkpoint's own records nest < 12 deep)
MAX_DEPTH = 32

# What one token of JSON may cost once parsed (CPython 3.10-3.13, 64-bit), each an upper
# bound measured against tracemalloc's peak for shapes that maximise it (empty containers,
# short or distinct keys, floats, dicts just grown): a dict (184 bytes with its first
# keys), a list (56), a string object without its characters (49), and one value (its
# slot in a list or dict, grown, its number object, and a distinct key's entry in the
# parser's memo). Characters cost 1 to 4 bytes each, once as the decoded document and
# once in its strings (`_bytes_per_char`).
_DICT, _LIST, _STRING, _VALUE = 184, 56, 49, 150
# `_bytes_per_char`: escapes of a character wider than Latin-1, and of a surrogate (astral)
_WIDE_ESCAPE = re.compile(rb"\\u(?:0[1-9a-fA-F]|[1-9a-fA-F])")
_ASTRAL_ESCAPE = re.compile(rb"\\u[dD][89abAB]")
# `_depth`: every bracket as [ or ], all but brackets and quotes deleted, then strings
_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_MARKS = bytes(c for c in range(256) if c not in b'[]{}"')
_STRING_RE = re.compile(rb'"[^"]*"')


@dataclass(frozen=True)
class Limits:
    """The limits of one kind of record (see the module docstring)."""

    max_bytes: int
    max_cost: int
    max_depth: int = MAX_DEPTH


def parse_cost(data: bytes) -> int:
    """An upper bound of the bytes `data` takes while and once parsed as JSON (its decoded
    text, every object of the result, the parser's memo of keys), from counts of its
    tokens: cheap next to parsing, and never below what the parse takes (tested on the
    shapes that cost most per byte)."""
    per_char = _bytes_per_char(data)
    objects, arrays = data.count(b"{"), data.count(b"[")
    values = data.count(b",") + objects + arrays + 1
    return (len(data) * per_char + _DICT * objects + _LIST * arrays + _VALUE * values
            + _STRING * (data.count(b'"') // 2))


def _bytes_per_char(data: bytes) -> int:
    """What a character of `data` may cost: once in the decoded document, once in a string.
    A string takes 1, 2 or 4 bytes per character after its widest one, which an ASCII
    document names with an escape (``\\u00e9``, ``\\ud83d\\ude00``)."""
    if not data.isascii() or _ASTRAL_ESCAPE.search(data):
        return 8
    return 4 if _WIDE_ESCAPE.search(data) else 2


def _depth(data: bytes, limit: int) -> int:
    """How deep the containers of `data` nest (brackets inside strings do not count), or
    `limit` + 1 when deeper: with C-speed passes over the bytes, never a loop per byte."""
    if b"\\" in data:  # escaped backslashes, then escaped quotes: what is left of '"' delimits strings
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Adjacent quotes enclose nothing that counts (an empty string, or the space between
    # two strings): dropped first, the few strings holding brackets by the pattern.
    marks = data.translate(_BRACKETS, _NOT_MARKS).replace(b'""', b"")
    if b'"' in marks:
        marks = _STRING_RE.sub(b"", marks)
    depth = 0
    while marks and depth <= limit:
        inner = marks.replace(b"[]", b"")  # the innermost pairs: one level per pass
        if len(inner) == len(marks):
            break  # unbalanced: not JSON, which the parse reports
        marks, depth = inner, depth + 1
    return depth


def _problem(data: bytes, limits: Limits) -> str | None:
    """Why `data` is over `limits`, or None."""
    if len(data) > limits.max_bytes:
        return f"{len(data)} bytes, over the limit of {limits.max_bytes} bytes for its kind of record"
    cost = parse_cost(data)
    if cost > limits.max_cost:
        return (f"parsing would take about {cost // _KIB} KiB of memory to parse ({len(data)} "
                "bytes of JSON), over the "
                f"limit of {limits.max_cost // _KIB} KiB for its kind of record")
    if data.count(b"{") + data.count(b"[") > limits.max_depth:
        depth = _depth(data, limits.max_depth)
        if depth > limits.max_depth:
            return f"nested more than {limits.max_depth} levels deep, over the limit for a record"
    return None


def decode(data: bytes, limits: Limits, where: str) -> Any:
    """The JSON value of `data`, a record read from `where` (its path, for messages).

    :raises CorruptRecord: `data` is over `limits` (bytes, estimated memory, nesting) or is
        not JSON in UTF-8; the message names `where` and the limit.
    """
    problem = _problem(data, limits)
    if problem is not None:
        raise CorruptRecord(f"{where}: {problem}; treated as corrupt")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError: not JSON, or an integer of more digits than Python converts
        raise CorruptRecord(f"{where}: not valid JSON ({type(exc).__name__}: {exc})") from None


def json_object(parse: Callable[[dict[str, Any]], T]) -> Callable[[Any], T]:
    """`parse` for a record that is a JSON object: anything else (a list, a string, a
    number) is refused with a TypeError naming what it is, which `read_record` reports
    as a corrupt record."""

    def parse_object(raw: Any) -> T:
        if not isinstance(raw, dict):
            raise TypeError(f"a JSON {type(raw).__name__}, not an object")
        return parse(raw)

    return parse_object


def read_record(store: Storage, key: str, parse: Callable[[Any], T], *, limits: Limits,
                where: str) -> T | None:
    """The record at `key` of `store`, read within `limits` and decoded, as `parse` makes
    it from the JSON value; None when there is none.

    :raises CorruptRecord: over a limit, not JSON, or refused by `parse` (ValueError,
        TypeError, KeyError, AttributeError, ArithmeticError or `CorruptMetadata`); the
        message names `where`.
    :raises StorageError: the store cannot be read (`ObjectNotFound` is None).
    """
    from airflow_sparkpoint.exceptions import ObjectNotFound

    try:
        data = store.get(key, limits.max_bytes)
    except ObjectNotFound:
        return None
    except ObjectTooLarge as exc:
        raise CorruptRecord(str(exc)) from None
    value = decode(data, limits, where)
    try:
        return parse(value)
    except CorruptRecord:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError, CorruptMetadata) as exc:
        raise CorruptRecord(f"{where}: malformed ({type(exc).__name__}: {exc})") from None


def read_record_or_warn(store: Storage, key: str, parse: Callable[[Any], T], *, limits: Limits, where: str,
                        what: str, unreachable: bool = False) -> T | None:
    """`read_record`, but an unreadable record (`what` names its kind in the warning) is
    logged and read as None: for records a reader can do without (metrics, drills, the
    status of a job that may not be running). `unreachable`: a store that cannot be read
    is logged and read as None too (a record no caller may fail on: metrics, a listing).

    :raises StorageError: the store cannot be read (not with `unreachable`).
    """
    try:
        return read_record(store, key, parse, limits=limits, where=where)
    except CorruptRecord as exc:
        log.warning("ignoring unreadable %s %s", what, exc)
        return None
    except StorageError as exc:
        if not unreachable:
            raise
        log.warning("cannot read %s: %s", where, exc)
        return None


def check_writable(data: bytes, limits: Limits, where: str, why: str = "") -> None:
    """Refuse to write a record its readers would refuse (over `limits`).

    :raises CatalogError: naming `where`, the limit and `why` (what makes such a record big).
    """
    problem = _problem(data, limits)
    if problem is not None:
        raise CatalogError(f"{where} would not be readable ({problem}); not "
                           f"written{'; ' + why if why else ''}")


def clip(text: str, limit: int) -> str:
    """`text` cut to at most about `limit` characters, its start and end kept (for free text
    a record carries: an error message, a plan's description)."""
    if len(text) <= limit:
        return text
    half = max(1, limit // 2 - 20)
    return f"{text[:half]} [... {len(text) - 2 * half} characters cut ...] {text[-half:]}"
