"""Quantities on the command line: '300B' tokens, '80GiB' of memory, '200Gbit/s' of bandwidth.

Counts take K, M, B (or G), T, P as powers of 1000. Bytes, in every command (`parse_bytes`):
KB, MB, GB, TB are SI (GB = 10⁹, IEC 80000-13), KiB, MiB, GiB, TiB binary (GiB = 2³⁰), bare K, M,
G, T binary too, as in nccl-tests' -b/-e sizes, and a plain number is bytes. Bandwidths, in every
command (`parse_bandwidth`, the argparse type `BandwidthFlag` of every bandwidth flag): a plain
number is GB/s; B/s, KB/s ... TB/s (SI), KiB/s ... TiB/s (binary) and Kbit/s ... Tbit/s, the "/s"
optional; "Gb/s" (bit or byte?) and the bare letters ("50G") are refused as ambiguous. Every
quantity must be > 0 (sizes that a command checks itself may be 0): a bad value is a one-line error
naming the flag, whichever way argparse handed it over.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_BYTES = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
BYTE_UNITS = "B; KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB, TiB or K, M, G, T (powers of 1024)"

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


def parse_bytes(text: str, flag: str, zero: bool = False) -> float:
    """'80GB', '80GiB', '64K', '8.6e10' -> bytes; with `zero`, '0' is allowed."""
    value, unit = _split(text, flag, text, zero)
    if unit not in _BYTES:
        raise ValueError(f"{flag}={text!r}: unknown unit {unit!r}; allowed: {BYTE_UNITS}")
    return value * _BYTES[unit]


RATES = {"B/s": 1.0, **{f"{p}B/s": 10.0 ** (3 * i) for i, p in enumerate("KMGT", 1)},
         **{f"{p}iB/s": 2.0 ** (10 * i) for i, p in enumerate("KMGT", 1)},
         **{f"{p}bit/s": 10.0 ** (3 * i) / 8 for i, p in enumerate("KMGT", 1)}}
"""Bandwidth unit -> bytes/s: the one table of every bandwidth flag."""
BARE_RATE = "GB/s"
"""What a bandwidth without a unit means: the unit NVIDIA and nccl-tests quote links and busbw in."""
RATE_UNITS = ("GB/s (also a plain number); B/s, KB/s, MB/s, TB/s (powers of 1000); KiB/s ... TiB/s "
              "(powers of 1024); Kbit/s, Mbit/s, Gbit/s, Tbit/s")


def _rate_unit(unit: str) -> str | None:
    """The `RATES` key a typed unit stands for ('gbit/s' -> 'Gbit/s', 'GiB' -> 'GiB/s'), None for
    one that is not a bandwidth or is ambiguous: case tells bytes (B) from bits (b), nothing else."""
    body = unit[:-2] if unit.lower().endswith("/s") else unit
    if body.lower().endswith("bit"):
        key = body[:-3].upper() + "bit/s"
    elif body.endswith("B"):
        key = body[:-1].upper().replace("I", "i") + "B/s"
    else:
        return None
    return key if key in RATES else None


@dataclass(frozen=True)
class Bandwidth:
    """A bandwidth as the user gave it: `value` in `unit` (a `RATES` key)."""

    value: float
    unit: str

    @property
    def bytes_per_s(self) -> float:
        return self.value * RATES[self.unit]

    def __str__(self) -> str:
        return f"{self.value:g} {self.unit}"


def rate_text(bytes_per_s: float, unit: str = BARE_RATE) -> str:
    """A bandwidth in `unit` ('450 GB/s', '400 Gbit/s'): figures echoed in the unit a user typed."""
    return f"{bytes_per_s / RATES[unit]:g} {unit}"


def parse_bandwidth(text: str, flag: str) -> Bandwidth:
    """'400Gbit/s', '12.5GB/s', '5' (GB/s) -> a `Bandwidth`, or a one-line ValueError naming `flag`
    and the units allowed."""
    m = re.fullmatch(rf"\s*([+-]?{_UNSIGNED})\s*([a-z]*(?:/s)?)\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{flag}={text!r} is not a number")
    value, _ = _split(m.group(1), flag, text)
    typed = m.group(2)
    unit = _rate_unit(typed) if typed else BARE_RATE
    if unit is None:
        raise ValueError(f"{flag}={text!r}: unknown or ambiguous unit {typed!r}; allowed: {RATE_UNITS}")
    return Bandwidth(value, unit)


@dataclass(frozen=True)
class Link:
    """An emulated link: its bandwidth and its latency per message."""

    bandwidth: Bandwidth
    latency_us: float = 0.0

    @property
    def gbps(self) -> float:
        """GB/s (10⁹ bytes/s): what `comm.configure(inter_node_gbps=)` and `TrainConfig` take."""
        return self.bandwidth.bytes_per_s / 1e9

    def __str__(self) -> str:
        return f"{self.bandwidth}, {self.latency_us:g} µs per message"


def parse_link(text: str, flag: str) -> Link:
    """'BW[,LATENCY_US]': '1', '10Gbit/s,20' -> a `Link` (bandwidth as `parse_bandwidth`, latency
    µs >= 0, default 0), or a one-line ValueError."""
    parts = str(text).split(",")
    if len(parts) > 2:
        raise ValueError(f"{flag} {text!r}: give BW[,LATENCY_US], e.g. 1GB/s or 10Gbit/s,20")
    bw = parse_bandwidth(parts[0], flag)
    try:
        latency = float(parts[1]) if len(parts) == 2 else 0.0
    except ValueError:
        latency = math.nan
    if not (math.isfinite(latency) and latency >= 0):
        raise ValueError(f"{flag} {text!r}: the latency must be µs >= 0, e.g. 1GB/s,20")
    return Link(bw, latency)


class BandwidthFlag:
    """argparse's `type=` of a bandwidth flag (`link`: BW[,LATENCY_US]): the value parsed while
    the command line is, so every command reads a bandwidth one way; a bad one is the parser's
    one-line error, exit 2. The tests find every bandwidth flag of every parser by this type."""

    def __init__(self, flag: str, link: bool = False) -> None:
        self.flag, self.link = flag, link
        self.__name__ = "bandwidth"

    def __call__(self, text: str) -> Bandwidth | Link:
        try:
            return parse_link(text, self.flag) if self.link else parse_bandwidth(text, self.flag)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None


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
