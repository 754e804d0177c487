"""Reading JSON that a user or a file gives: one rule for every input.

Python's json keeps the last of a key given twice in one object, silently: a manifest with
`"step": 15, ..., "step": 3` would resume at step 3 with step 15's weights, a config file would
take whichever value came last. Every JSON input of ringzero is read with `unique_keys` as its
`object_pairs_hook`, which refuses such an object instead.
"""

from __future__ import annotations


def unique_keys(pairs: list) -> dict:
    """The object of `pairs`, or a ValueError naming a key it has more than once."""
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"key {twice[0]!r} appears more than once in one object")
    return dict(pairs)
