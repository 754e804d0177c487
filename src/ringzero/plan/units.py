"""Quantities on the command line: '300B' tokens, '80GiB' of memory, '200Gbit/s' of bandwidth.

Counts take K, M, B (or G), T, P as powers of 1000. Bytes, in every command (`parse_bytes`):
KB, MB, GB, TB are SI (GB = 10⁹, IEC 80000-13), KiB, MiB, GiB, TiB binary (GiB = 2³⁰), bare K, M,
G, T binary too, as in nccl-tests' -b/-e sizes, and a plain number is bytes; bandwidths also take
bits per second. Every quantity must be > 0 (sizes that a command checks itself may be 0): a bad
value is a one-line error naming the flag, whichever way argparse handed it over.
"""

from __future__ import annotations

import math
import re

_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_BYTES = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
BYTE_UNITS = "B; KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB, TiB or K, M, G, T (powers of 1024)"
_BITS = {"kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8}

_UNSIGNED = r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?"
NEGATIVE_VALUE = re.compile(rf"^-{_UNSIGNED}[a-z]*(?:/s)?$", re.IGNORECASE)
"""A negative quantity with a unit ("-5B", "-80GiB", "-1e9"): a flag's value, not an option."""


def _split(text: str, flag: str, given: str | None = None, zero: bool = False) -> tuple[float, str]:
    """(number, unit) of a positive quantity such as '300B' or '1.5e9' (`given`: the flag's whole
    value, for the error; `zero`: 0 is allowed)."""
    given = text if given is None else given
    m = re.fullmatch(rf"\s*([+-]?{_UNSIGNED})\s*([a-z]*)\s*", text.lower())
    if not m or not math.isfinite(float(m.group(1))):
        raise ValueError(f"{flag}={given!r} is not a number")
    value = float(m.group(1))
    if not (value >= 0 if zero else value > 0):
        raise ValueError(f"{flag} must be {'>=' if zero else '>'} 0, got {given!r}")
    return value, m.group(2)


def parse_count(text: str, flag: str = "--tokens") -> float:
    """'300e9', '300B', '2T', '1.5M' -> a count (K, M, B or G, T, P: powers of 1000)."""
    value, unit = _split(text, flag)
    if unit not in _SCALE:
        raise ValueError(f"{flag}={text!r}: unknown suffix {unit!r}; allowed: K, M, B (or G), T, P")
    return value * _SCALE[unit]


def parse_bytes(text: str, flag: str, per_second: bool = False, zero: bool = False) -> float:
    """'80GB', '80GiB', '64K', '8.6e10' -> bytes; with `per_second`, '300GB/s', '200Gbit/s' -> bytes/s;
    with `zero`, '0' is allowed."""
    body = text.strip()
    if per_second and body.lower().endswith("/s"):
        body = body[:-2]
    value, unit = _split(body, flag, text, zero)
    factor = _BYTES.get(unit) or (_BITS.get(unit) if per_second else None)
    if factor is None:
        units = BYTE_UNITS + ("; each with /s, or Kbit/s ... Tbit/s" if per_second else "")
        raise ValueError(f"{flag}={text!r}: unknown unit {unit!r}; allowed: {units}")
    return value * factor


def parse_size(text: str, flag: str) -> int:
    """A whole number of bytes >= 0 ('64KiB' -> 65536, '1.5M' -> 1572864, '1GB' -> 10**9), for the
    commands that check the least size themselves; anything else is one line starting 'bad size'."""
    try:
        return round(parse_bytes(str(text), flag, zero=True))
    except ValueError:
        raise ValueError(f"bad size {text!r} for {flag}: expected a number of bytes with an optional "
                         f"unit: {BYTE_UNITS}") from None


def parse_sizes(text: str, flag: str = "--sizes") -> tuple[int, ...]:
    """'64KiB,2K,1GB' -> (65536, 2048, 10**9): sizes of `parse_size`, each at least 1 byte."""
    texts = [t.strip() for t in text.split(",") if t.strip()]
    if not texts:
        raise ValueError(f"{flag} needs at least one value")
    sizes = tuple(parse_size(t, flag) for t in texts)
    for t, size in zip(texts, sizes):
        if size < 1:
            raise ValueError(f"bad size {t!r}: must be at least 1 byte")
    return sizes


def cached_hash(obj) -> int:
    """A frozen dataclass's hash of its fields, computed once and kept on the instance: the
    planner's caches key on shapes and hardware thousands of times per search."""
    h = obj.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(obj, f) for f in obj.__dataclass_fields__))
        object.__setattr__(obj, "_hash", h)
    return h


def uncached_state(obj) -> dict:
    """`obj`'s pickled state without its cached hash: string hashes are salted per process, so a
    hash carried into another process would not match an equal object made there."""
    state = dict(obj.__dict__)
    state.pop("_hash", None)
    return state
