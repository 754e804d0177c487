"""Child processes for tests/test_transport_channel.py: one end of a shared-memory channel."""

from __future__ import annotations

import os
import signal

import torch

from ringzero.comm.transport import channel, layout, segment
from ringzero.comm.transport.outbound import Outbound


def sender(seg: str, receiver_pid: int, messages: list[tuple[int, int, int]], die: bool = False) -> None:
    """Create segment `seg`, send `messages` [(tag, bytes, seed)], wait for them; `die`: SIGKILL
    itself after the first message instead."""
    mm = segment.create(seg, layout.segment_bytes(),
                        lambda m: channel.init_header(m, layout.SLOTS, layout.SLOT_BYTES, os.getpid(), layout.ENTRIES))
    out = Outbound(channel.ring(mm, "rank 1", receiver_pid, 30.0))
    works = []
    for i, (tag, n, seed) in enumerate(messages):
        g = torch.Generator().manual_seed(seed)
        works.append(out.send(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g), tag))
        if die and i == 0:
            os.kill(os.getpid(), signal.SIGKILL)
    for w in works:
        w.wait()
