"""Keep freed tensor memory in the process instead of handing it back to the kernel every step.

torch's CPU tensors come from the C library's `malloc`. glibc serves any block above its mmap
threshold (128 KiB, raised dynamically to at most 32 MiB) with a fresh `mmap` and returns it with
`munmap` on free, and it trims the top of the heap whenever 128 KiB are free there. A training step
allocates and frees the same activation-sized tensors every iteration, so every step page-faults
them in again and the kernel zeroes each 4 KiB page: on the 2-core development machine this was
42 % of the CPU time of a recomputation benchmark step (sys 23.8 s of 56 s), and the step took
2.2x as long as with the setting below (483 ms against 222 ms, GPT 2 x 64, seq 512, batch 4:
`RINGZERO_MALLOC=system /usr/bin/time -v ringzero bench train --nproc 2 --suites recompute
--rc-layers 2 --rc-hidden 64 --rc-heads 4 --rc-seq 512 --rc-batch 4`, then without
`RINGZERO_MALLOC=system`).

`tune()` raises both thresholds to 1 GiB with `mallopt`, so freed blocks are reused: the same thing
jemalloc/tcmalloc give, which PyTorch's CPU performance guide recommends, without a preload. Every
rank ringzero starts calls it; ringzero's own timings and those of the torch peers it benchmarks
against run in the same processes, so comparisons stay fair. It does nothing when the C library is
not glibc, when the user already set `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_`, or when
`RINGZERO_MALLOC=system`. The price: a process keeps its peak heap until it exits.
"""

from __future__ import annotations

import ctypes
import functools
import os

_M_TRIM_THRESHOLD = -1     # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30        # bytes; mallopt takes an int
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _glibc():
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version          # only glibc has it; musl, macOS and Windows do not
        return libc
    except (OSError, AttributeError):
        return None


@functools.cache
def tune() -> bool:
    """Apply the thresholds once per process; True when they are in effect."""
    if os.environ.get("RINGZERO_MALLOC", "tuned") == "system" or any(k in os.environ for k in _ENV):
        return False
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, THRESHOLD)) \
        and bool(libc.mallopt(_M_TRIM_THRESHOLD, THRESHOLD))
