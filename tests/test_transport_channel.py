"""The shared-memory channel and segment on their own, between two processes, without torch.distributed.

Messages of every size class (empty, within a slot, a slot exactly, across slots, more than the
whole ring, which the writer thread finishes) arrive whole and in order; tags match in posting
order with out-of-order ones held aside; a sender that dies is noticed by a waiting receiver within
a second; a segment of another mode, size or a symbolic link is refused; names are unlinked once
attached and swept when their creator is gone.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest
import torch

from ringzero.comm.transport import channel, hosts, layout, segment
from ringzero.comm.transport.inbound import Inbound
from shm_peer import sender

SLOT = layout.SLOT_BYTES
SIZES = (0, 1, 4, SLOT - 1, SLOT, SLOT + 1, 3 * SLOT + 5, layout.SLOTS * SLOT + 12345)


def _expected(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def _receiver(seg: str, pid: int) -> Inbound:
    def attach():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            mm = segment.attach(seg, layout.segment_bytes())
            if mm is not None and channel.ready(mm):
                segment.unlink(seg)
                return channel.ring(mm, "rank 0", pid, 30.0)
            time.sleep(0.001)
        raise AssertionError("no segment")
    return Inbound(attach)


def _start(messages, die=False):
    seg = segment.name(hosts.new_token(), os.getpid(), "test", 0, 1)
    p = mp.get_context("spawn").Process(target=sender, args=(seg, os.getpid(), messages, die))
    p.start()
    return seg, p


def test_every_size_arrives_whole_and_in_order():
    messages = [(0, n, 100 + i) for i, n in enumerate(SIZES)]
    seg, p = _start(messages)
    inbound = _receiver(seg, p.pid)
    for tag, n, seed in messages:
        out = torch.empty(n, dtype=torch.uint8)
        inbound.recv(out, tag).wait()
        assert torch.equal(out, _expected(n, seed)), n
    p.join(30)
    assert p.exitcode == 0
    assert not os.path.exists(os.path.join(segment.DIR, seg))       # unlinked once attached


def test_tags_match_in_posting_order_and_early_messages_wait_aside():
    messages = [(5, 100, 1), (7, SLOT + 3, 2), (5, 0, 3), (7, 10, 4)]
    seg, p = _start(messages)
    inbound = _receiver(seg, p.pid)
    second7 = torch.empty(10, dtype=torch.uint8)
    first7 = torch.empty(SLOT + 3, dtype=torch.uint8)
    w7a, w7b = inbound.recv(first7, 7), inbound.recv(second7, 7)
    w7b.wait()                      # reads past both tag-5 messages, holding them aside
    w7a.wait()
    a5, b5 = torch.empty(100, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8)
    inbound.recv(a5, 5).wait()
    inbound.recv(b5, 5).wait()
    assert torch.equal(first7, _expected(SLOT + 3, 2)) and torch.equal(second7, _expected(10, 4))
    assert torch.equal(a5, _expected(100, 1))
    p.join(30)


def test_a_receive_of_the_wrong_size_fails_in_one_line():
    seg, p = _start([(0, 64, 1)])
    inbound = _receiver(seg, p.pid)
    with pytest.raises(RuntimeError, match="a message of 64 bytes .* met a receive of 32 bytes"):
        inbound.recv(torch.empty(32, dtype=torch.uint8), 0).wait()
    p.join(30)


def test_a_dead_sender_is_noticed_not_waited_for():
    seg, p = _start([(0, 8, 1), (0, 8, 2)], die=True)
    inbound = _receiver(seg, p.pid)
    inbound.recv(torch.empty(8, dtype=torch.uint8), 0).wait()       # the message sent before it died
    p.join(30)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"rank 0 \(pid {p.pid}\) exited during a shared-memory transfer"):
        inbound.recv(torch.empty(8, dtype=torch.uint8), 0).wait()
    assert time.monotonic() - t0 < 5


def test_segments_are_private_and_checked(tmp_path):
    seg = segment.name(hosts.new_token(), os.getpid(), "test", 0, 1)
    path = os.path.join(segment.DIR, seg)
    mm = segment.create(seg, 4096)
    try:
        assert os.stat(path).st_mode & 0o777 == 0o600
        with pytest.raises(FileExistsError):
            segment.create(seg, 4096)                    # a name is never reused
        with pytest.raises(segment.Refused, match="4096 bytes, expected 8192"):
            segment.attach(seg, 8192)
        os.chmod(path, 0o644)
        with pytest.raises(segment.Refused, match="mode 644"):
            segment.attach(seg, 4096)
    finally:
        mm.close()
        segment.unlink(seg)
    target = tmp_path / "planted"
    target.write_bytes(b"\0" * 4096)
    os.symlink(target, path)
    try:
        with pytest.raises(OSError):
            segment.attach(seg, 4096)                    # O_NOFOLLOW: a planted link is not followed
        with pytest.raises(FileExistsError):
            segment.create(seg, 4096)
    finally:
        os.unlink(path)


def test_sweep_removes_names_of_dead_creators_only():
    token = hosts.new_token()
    p = mp.get_context("spawn").Process(target=time.sleep, args=(0,))
    p.start()
    p.join()
    dead = segment.name(token, p.pid, "g", 0, 1)
    live = segment.name(token, os.getpid(), "g", 1, 0)
    for seg in (dead, live):
        segment.create(seg, 4096).close()
    try:
        assert dead in segment.sweep() and os.path.exists(os.path.join(segment.DIR, live))
        assert segment.sweep(token) == [live]
    finally:
        segment.unlink(dead)
        segment.unlink(live)
