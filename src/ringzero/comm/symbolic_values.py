"""The values a symbolic rank's buffer holds (`ringzero.comm.symbolic` runs algorithms over them).

A value is a multiset of terms; rank r's element i is the term written letter(r)+i (rank 0's is `a0`,
rank 1's `b0`, as in the textbook walk-through of the ring on GPUs A-D, where A sends a0 to B), and a
reduction merges multisets, so after a ring all-reduce every rank holds `a0+b0+c0+d0` at element 0.
Never-written scratch is `None` ('·'); reducing into or from it gives `JUNK` ('?'), which no correct
result contains.
"""

from __future__ import annotations


def letter(rank: int) -> str:
    """Rank r's lower-case letter: 0 -> 'a', 1 -> 'b', ... (upper case names the rank itself)."""
    return chr(ord("a") + rank)


class Sym:
    """A symbolic element: a sorted multiset of terms (rank, index), printed like `a0+b0+c0`."""

    __slots__ = ("terms",)

    def __init__(self, terms) -> None:
        self.terms = tuple(sorted(terms, key=lambda t: (t[1], t[0])))

    @classmethod
    def term(cls, rank: int, index: int) -> "Sym":
        return cls(((rank, index),))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sym) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(self.terms)

    def __repr__(self) -> str:
        return fmt(self, compact=False)


class _Junk:
    """The result of reducing into or from never-written scratch."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "?"


JUNK = _Junk()


def combine(a, b):
    """op(a, b) on symbols: the union of the two multisets (JUNK if either was never written)."""
    if isinstance(a, Sym) and isinstance(b, Sym):
        return Sym(a.terms + b.terms)
    return JUNK


def fmt(value, compact: bool = False) -> str:
    """'·' for never written, '?' for JUNK, else the terms joined by '+'.

    With `compact`, four or more consecutive ranks with the same index print as `a0+…+d0`, so a
    full 16-rank sum stays readable (`a0+…+p0`). The explainer uses it above four ranks only, where
    the full form (`a0+b0+c0+d0`) would not fit.
    """
    if value is None:
        return "·"
    if not isinstance(value, Sym):
        return "?"
    runs: list[list[tuple[int, int]]] = []
    for rank, index in value.terms:
        if runs and runs[-1][-1] == (rank - 1, index):
            runs[-1].append((rank, index))
        else:
            runs.append([(rank, index)])
    parts = []
    for run in runs:
        names = [f"{letter(r)}{i}" for r, i in run]
        parts += [names[0], "…", names[-1]] if compact and len(run) >= 4 else names
    return "+".join(parts)
