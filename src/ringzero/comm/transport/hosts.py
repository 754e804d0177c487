"""Which ranks share a host's memory: a host id per rank, and the job's token, through the store.

Two ranks may use shared memory when they run on one kernel, see the same /dev/shm and the same
process ids (a dead peer is recognised by its pid). The host id hashes exactly that: the host name,
the kernel's boot id, the device and inode of /dev/shm, and the pid namespace. It is never inferred
from LOCAL_WORLD_SIZE or rank numbers: a tensor-parallel group of a multi-node job may sit on one
host while its data-parallel group spans several, and the decision is taken per pair of ranks.

Each rank publishes "<host id> <pid>" under its global rank in the default group's store when it
first needs a peer's, and reads the peers' it talks to; no collective is needed, so a pair of
pipeline stages can set up their channel while the other ranks do something else. The job's token
(random, in every segment name: nobody outside the job can guess a name to plant) is the launcher's
RINGZERO_SHM_TOKEN when it set one, else the first one any rank proposes in the store.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import weakref
from functools import lru_cache

import torch.distributed as dist

_KEY = "ringzero/shm/"
ENV_TOKEN = "RINGZERO_SHM_TOKEN"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def host_id() -> str:
    """This process's host id (see the module doc)."""
    parts = [socket.gethostname(), _read("/proc/sys/kernel/random/boot_id")]
    for path in ("/dev/shm", "/proc/self/ns/pid"):
        try:
            st = os.stat(path)
            parts.append(f"{st.st_dev}:{st.st_ino}")
        except OSError:
            parts.append("-")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def new_token() -> str:
    return secrets.token_hex(8)


def _store():
    return dist.distributed_c10d._get_default_store()


_seen: dict = {"store": None, "token": None, "published": False, "peers": {}}
"""What was read from and written to the current default store (a new process group, a new store:
everything is asked again)."""


def _current():
    store = _store()
    known = _seen["store"]
    if known is None or known() is not store:       # weakly: the store dies with its process group
        _seen.update(store=weakref.ref(store), token=None, published=False, peers={})
    return store


def token() -> str:
    """The job's token (see the module doc)."""
    store = _current()
    if _seen["token"] is None:
        mine = os.environ.get(ENV_TOKEN) or new_token()
        got = store.compare_set(_KEY + "token", "", mine)
        _seen["token"] = got.decode() if isinstance(got, bytes) else str(got)
    return _seen["token"]


def peer(global_rank: int) -> tuple[str, int]:
    """(host id, pid) of `global_rank`, waiting for it to publish them (it does on its first
    shared-memory decision, as this rank does here)."""
    store = _current()
    if not _seen["published"]:
        store.set(f"{_KEY}rank/{dist.get_rank()}", f"{host_id()} {os.getpid()}")
        _seen["published"] = True
    peers = _seen["peers"]
    if global_rank not in peers:
        host, pid = store.get(f"{_KEY}rank/{global_rank}").decode().split()
        peers[global_rank] = (host, int(pid))
    return peers[global_rank]
