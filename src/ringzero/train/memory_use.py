"""How much memory a rank used at its peak, and how much its device had: the headroom
`ringzero analyze` names when it runs short.

On CUDA the caching allocator's peak of reserved bytes against the device's total
(`torch.cuda.max_memory_reserved`, `torch.cuda.mem_get_info`): what is reserved is what another
allocation cannot have. On the CPU the process's peak resident set (`getrusage`'s `ru_maxrss`,
KiB on Linux) against the host's physical memory, which every rank of the host shares: the
headroom of a host is what its ranks' peaks leave of it together.
"""

from __future__ import annotations

import os
import resource
import socket

import torch


def peak(device: torch.device) -> dict:
    """{"device", "host", "peak_bytes", "capacity_bytes"} of this rank so far."""
    if device.type == "cuda":
        return {"device": "cuda", "host": socket.gethostname(), "peak_bytes": torch.cuda.max_memory_reserved(device),
                "capacity_bytes": torch.cuda.mem_get_info(device)[1]}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"device": "cpu", "host": socket.gethostname(), "peak_bytes": rss,
            "capacity_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")}
