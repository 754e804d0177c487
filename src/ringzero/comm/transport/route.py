"""Which object a group's point-to-point messages are posted on (`comm.transport`'s `p2p`)."""

from __future__ import annotations

import sys
import weakref

import torch.distributed as dist

from ringzero.comm.config import get_config

_GROUPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def available() -> bool:
    """Whether this process can use shared memory at all (Linux with a /dev/shm)."""
    import os
    return sys.platform.startswith("linux") and os.path.isdir("/dev/shm")


def p2p(group, device=None):
    """The point-to-point object for `group` (see the module doc); `device`: the tensors' device."""
    pg = group if group is not None else dist.group.WORLD
    mode = get_config().transport
    if mode == "gloo" or (device is not None and device.type != "cpu"):
        return pg
    got = _GROUPS.get(pg)
    if got is None:
        if not available() or "gloo" not in str(dist.get_backend(pg)):
            if mode == "shm":
                raise RuntimeError("transport shm needs Linux's /dev/shm and a gloo group; use auto or gloo")
            return pg
        from ringzero.comm.transport import segment
        from ringzero.comm.transport.shm import ShmGroup
        if not _GROUPS:
            segment.sweep()                     # once: names of jobs whose ranks died before unlinking
        got = _GROUPS[pg] = ShmGroup(pg, require=False)
    got.require = mode == "shm"
    return got


def in_use(group=None, device=None) -> str:
    """The transport `group`'s messages take between ranks of this host: "shm" or the backend's name
    ("gloo" where there is no process group at all)."""
    if not dist.is_initialized():
        return "gloo"
    got = p2p(group, device)
    return "shm" if got is not (group if group is not None else dist.group.WORLD) else str(dist.get_backend(group))
