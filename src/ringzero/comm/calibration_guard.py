"""The guards of a calibration: its sizes must spread enough to tell α from β before it is
measured (`check_sizes`), and a fit must predict its own measurements at least as well as the
built-in defaults (`plan.comm.network.AlphaBetaGamma()`), or it is not written (`cost.save`)."""

from __future__ import annotations


TOLERANCE = 1e-6
"""Median errors this close are equal: a fit of measurements the defaults predict exactly recovers
them up to rounding, and is not refused for its last bits."""


class WorseThanDefaults(RuntimeError):
    """A fit that predicts its own measurements worse than the built-in defaults (`save` refuses it)."""


def check_better(cal) -> None:
    """WorseThanDefaults when `cal`'s median fit error exceeds the defaults' on the same rows.

    No file means `auto` prices with `AlphaBetaGamma()`'s defaults; a file replaces them for every
    later call, so one that predicts its own measurements worse (a noisy sweep of a few sizes once
    fitted α = β = γ = 0 at a 57.9 % median error, as `ringzero bench comm --nproc 2 --collective
    all_reduce --sizes 1KiB,2KiB --iters 1 --calibrate --out /tmp/cal.json` can on a busy machine)
    would only make `auto` pick worse. A fit from an
    older ringzero, without the defaults' error beside it, is not judged."""
    mine, defaults = cal.error.get("median"), cal.error.get("defaults", {}).get("median")
    if mine is not None and defaults is not None and mine > defaults + TOLERANCE:
        raise WorseThanDefaults(
            f"calibration not written: its median fit error, {mine:.1%} over {cal.error.get('rows')} rows, is worse "
            f"than the built-in defaults' {defaults:.1%} on the same measurements, which \"auto\" keeps using; "
            "measure more sizes (--sizes 4KiB,1MiB,16MiB) or iterations (--iters) on a quieter machine")


SIZE_SPREAD = 2.0
"""The largest message a calibration measures must be at least this many times its smallest."""


def check_sizes(nbytes) -> None:
    """Refuse message sizes from which α and β cannot both be fitted.

    At one message size every call of a world moves the same bytes in the same rounds, so the
    per-round cost α and the per-byte cost β are collinear and least squares puts the time on one
    of them (β = 0 in practice): a calibration that looks fine and mispredicts every other size.
    nccl-tests is run as a sweep (-b 8 -e 128M -f 2) for the same reason, so a sweep is what its
    users expect; refusing costs one flag, a silent β = 0 would mislead every later "auto" pick.
    """
    sizes = sorted({int(b) for b in nbytes if b > 0})
    if not sizes or sizes[-1] < SIZE_SPREAD * sizes[0]:
        shown = ("none" if not sizes else _size(sizes[0]) if len(sizes) == 1
                 else f"{_size(sizes[0])} to {_size(sizes[-1])}")
        raise ValueError(f"calibration needs message sizes at least {SIZE_SPREAD:g}x apart to fit both "
                         f"α (per round) and β (per byte), got {shown}; give e.g. --sizes 4KiB,1MiB,16MiB")


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"
