"""Emulated inter-node links: ranks on one machine, messages between "nodes" slowed to a network's pace.

    with comm.configure(ranks_per_node=2, inter_node_gbps=1.0, inter_node_latency_us=5.0):
        comm.all_reduce(t, algorithm="hierarchical")   # ranks 0-1 and 2-3 talk over a 1 GB/s "wire"

On one machine every pair of ranks talks over shared memory or loopback, so an algorithm that
spares the slow network (hierarchical all-reduce) looks no better than one that does not (the
flat ring). The emulator gives each rank one outgoing inter-node link, its NIC, and charges every
message to a rank of another node (nodes: `CommConfig.ranks_per_node` consecutive global ranks) the
time that link would take, in the α-β model of a message (Hockney, "The communication challenge
for MPP: Intel Paragon and Meiko CS-2", Parallel Computing 1994): a message of B bytes occupies
the link for B / (G·1e9) s, starting when the link has finished the previous one (serialisation;
the link is shared by all threads of the rank, under a lock), and arrives `inter_node_latency_us`
after it has left.

Incast. A link carries one message at a time both ways: a message also occupies its receiver's
incoming link, so W senders into one rank take W times as long as one (the parameter server's
incast, which a sender-only model would hide). Under ringzero's own launcher and test pool the
ranks share one array of the times each rank's incoming link is free again (`share_ingress`); a
message starts once both its sender's and its receiver's links are free and holds both for
B / (G·1e9) s. Elsewhere (torchrun) only the sending side is modelled.

The rank's NIC thread sleeps (`time.sleep`, no busy-waiting: the CPU stays free for the other ranks
of the machine) until the emulated link would have delivered the message, and only then posts the
real send (`send_later`); the collective's own thread goes on meanwhile, as it would beside a real
NIC's DMA, and waits on the send's handle when it needs it done. So the receiver sees the message
no earlier than a real link would deliver it, and receives need no delay of their own: the NIC's
wait is the transfer. The NIC sends one message after another, each costing α + B·β on its own,
which is what `plan.comm.links.link_seconds` prices. Intra-node messages are never delayed, and the real transport's
own time comes on top of the emulated one. The backend's own collectives (algorithm "torch")
bypass ringzero's point-to-point layer and are not delayed.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

from ringzero.comm import timeline


@dataclass(frozen=True)
class Link:
    """The emulated inter-node link of this rank: bandwidth in bytes/s and per-message latency in s."""

    bytes_per_s: float
    latency_s: float


def link_for(config) -> Link | None:
    """The link `config` (a `CommConfig`) asks for, or None when no emulation is configured."""
    if config.inter_node_gbps is None:
        return None
    return Link(config.inter_node_gbps * 1e9, config.inter_node_latency_us * 1e-6)


_INGRESS = None
"""A shared array (`multiprocessing.Array('d', world)`): when each global rank's incoming link is
free again, on the perf_counter clock (CLOCK_MONOTONIC, one for every process of the host); None
when the launcher shares none."""


def share_ingress(array) -> None:
    """Use `array` (one slot per global rank, zeros at start) for the ranks' incoming links."""
    global _INGRESS
    _INGRESS = array


class _Nic:
    """The rank's outgoing link: when it is free again. One per process (one rank per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free_at = 0.0

    def arrival(self, link: Link, nbytes: int, dst: int | None = None) -> float:
        """Reserve the link (and global rank `dst`'s incoming link, when shared) for `nbytes`
        (perf_counter clock); returns when the message arrives."""
        with self._lock:
            now = time.perf_counter()
            busy = nbytes / link.bytes_per_s
            if _INGRESS is not None and dst is not None:
                with _INGRESS.get_lock():
                    leaves = max(now, self._free_at, _INGRESS[dst]) + busy
                    _INGRESS[dst] = leaves
            else:
                leaves = max(now, self._free_at) + busy
            self._free_at = leaves
        return leaves + link.latency_s


NIC = _Nic()


def transmit(link: Link, nbytes: int, dst: int | None = None) -> None:
    """Sleep until `link` would have delivered a message of `nbytes` sent now to global rank `dst`
    (after the link's earlier messages). Call just before posting the real send of an inter-node
    message."""
    wait_until(NIC.arrival(link, nbytes, dst))


def wait_until(deadline: float) -> None:
    """Sleep until perf_counter() reaches `deadline` (`time.sleep` never returns early, except on a
    signal; the loop covers that case)."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left)


class Delayed:
    """The handle of a send the NIC thread posts once the link has delivered it: `wait()` waits for
    the posting, then for the send itself (an error raised while posting is raised here)."""

    def __init__(self) -> None:
        self._posted = threading.Event()
        self._work = None
        self._error: BaseException | None = None

    def wait(self) -> None:
        self._posted.wait()
        if self._error is not None:
            raise self._error
        self._work.wait()


_queue: queue.SimpleQueue = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def _nic() -> None:
    while True:
        link, nbytes, dst, post, handle = _queue.get()
        try:
            with timeline.span("transmit", "link", bytes=nbytes, dst=dst):
                transmit(link, nbytes, dst)
            handle._work = post()
        except BaseException as e:            # noqa: BLE001 - handed to whoever waits on the send
            handle._error = e
        handle._posted.set()


def send_later(link: Link, nbytes: int, post, dst: int | None = None) -> Delayed:
    """Have the rank's NIC thread call `post()` (which posts the real send and returns its work)
    once `link` has delivered `nbytes` to global rank `dst`, after every message queued before;
    returns its handle.
    Messages to one peer keep their order: the NIC sends in queue order."""
    global _thread
    with _started:
        if _thread is None:
            _thread = threading.Thread(target=_nic, name="ringzero-nic", daemon=True)
            _thread.start()
    handle = Delayed()
    _queue.put((link, nbytes, dst, post, handle))
    return handle
