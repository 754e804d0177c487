"""Steps of flows: the form a collective's schedule takes for the simulator.

A `Step` is a set of flows that start together: flow j carries `nbytes[j]` from group rank
`src[j]` to `dst[j]` in `pieces[j]` wire messages. A step stands for `repeat` consecutive steps of
one shape: repetition i carries the sizes rolled by i·`roll` places (flow j takes the size of flow
(j - i·roll) mod len), which is how a ring's chunks walk round it (at step s rank r sends chunk
r - s). When every size is equal the roll changes nothing, and a simulator prices the step once.

Steps are numbered from 1 in time order; the steps of a `Schedule` run one after another, each
starting when the previous one has delivered all its flows (a synchronous model of the algorithm's
dependent rounds, the one `plan.comm.links.emulated_seconds` prices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ringzero.plan.comm.volume import Call

MAX_FLOWS = 20_000_000
"""Flows a compressed schedule may store (about 1 GB as Python tuples): beyond it the schedule is
refused with its size rather than built."""


@dataclass(frozen=True)
class Step:
    src: tuple[int, ...]
    dst: tuple[int, ...]
    nbytes: tuple[int, ...]
    pieces: tuple[int, ...]
    repeat: int = 1
    roll: int = 0
    tag: str = ""
    """The algorithm's name for the phase (ring, up, down, leaders, ...), for traces and tables."""

    def __post_init__(self) -> None:
        n = len(self.src)
        if not len(self.dst) == len(self.nbytes) == len(self.pieces) == n:
            raise ValueError("a step's src, dst, nbytes and pieces must have one entry per flow")
        if self.repeat < 1:
            raise ValueError(f"a step repeats >= 1 times, got {self.repeat}")

    @property
    def uniform(self) -> bool:
        """Whether every repetition is the same step (no roll, or all sizes equal)."""
        return self.roll == 0 or self.repeat == 1 or len(set(self.nbytes)) <= 1

    def sizes_at(self, i: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(nbytes, pieces) of repetition i."""
        if self.uniform or not self.nbytes:
            return self.nbytes, self.pieces
        k = (i * self.roll) % len(self.nbytes)
        return (self.nbytes[-k:] + self.nbytes[:-k] if k else self.nbytes,
                self.pieces[-k:] + self.pieces[:-k] if k else self.pieces)


@dataclass(frozen=True)
class Schedule:
    call: Call
    steps: tuple[Step, ...]

    @property
    def count(self) -> int:
        """Steps in time, repetitions counted."""
        return sum(s.repeat for s in self.steps)

    @property
    def stored(self) -> int:
        """Flows held (what the compressed form costs in memory)."""
        return sum(len(s.src) for s in self.steps)

    def messages(self) -> Iterator[tuple[int, int, int, int]]:
        """Every (step, src, dst, nbytes), steps numbered from 1; zero-byte flows left out, as the
        algorithms never send them."""
        at = 0
        for s in self.steps:
            for i in range(s.repeat):
                at += 1
                sizes, _ = s.sizes_at(i)
                for a, b, z in zip(s.src, s.dst, sizes):
                    if z:
                        yield at, a, b, z


def compress(steps: list[Step]) -> list[Step]:
    """Merge consecutive equal steps (same flows, same sizes) into one repeated step."""
    out: list[Step] = []
    for s in steps:
        last = out[-1] if out else None
        if (last is not None and last.roll == 0 and s.roll == 0 and last.tag == s.tag
                and (last.src, last.dst, last.nbytes, last.pieces) == (s.src, s.dst, s.nbytes, s.pieces)):
            out[-1] = Step(last.src, last.dst, last.nbytes, last.pieces, last.repeat + s.repeat, 0, last.tag)
        else:
            out.append(s)
    return out


def check_size(flows: int, what: str, bound: int = MAX_FLOWS, at_least: bool = False) -> None:
    """Refuse a schedule of more than `bound` stored flows, naming its size (`at_least`: a count
    stopped past the bound) and the bound."""
    if flows > bound:
        raise ValueError(f"{what} needs {'at least ' if at_least else ''}{flows:,} flows in its schedule, more "
                         f"than the {bound:,} the simulator holds; use fewer GPUs or a compressed algorithm "
                         f"(ring, tree, hierarchical, hierarchical_2d)")
