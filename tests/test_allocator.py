"""`ringzero.allocator`: freed tensor memory stays in the process (no munmap/page-fault cycle per
step), and the user's own allocator settings win."""

import os
import subprocess
import sys

import pytest

from ringzero import allocator

pytestmark = pytest.mark.skipif(allocator._glibc() is None, reason="mallopt is glibc's; other C libraries are left alone")

_CHILD = """
import os, sys, torch
from ringzero import allocator
tuned = allocator.tune()
page = os.sysconf("SC_PAGE_SIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page
x = torch.ones(64 * 2**20)          # 256 MiB, touched
before = rss()
del x
print(tuned, (before - rss()) / 2**20)
"""


def _child(**env) -> tuple[str, float]:
    e = {k: v for k, v in os.environ.items() if k not in ("RINGZERO_MALLOC", *allocator._ENV)}
    out = subprocess.run([sys.executable, "-c", _CHILD], env={**e, **env}, capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    return out[0], float(out[1])


def test_tuned_process_keeps_freed_memory_and_system_one_returns_it():
    tuned, returned = _child()
    assert tuned == "True" and returned < 16                 # freed block kept for reuse
    tuned, returned = _child(RINGZERO_MALLOC="system")
    assert tuned == "False" and returned > 200               # glibc munmaps a block above its threshold


def test_users_own_malloc_settings_are_left_alone():
    tuned, _ = _child(MALLOC_MMAP_THRESHOLD_="131072")
    assert tuned == "False"
