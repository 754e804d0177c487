"""One rank's optimizer state in a file, streamed through host buffers (ZeRO-Infinity, Rajbhandari et
al. 2021 §5: optimizer states on NVMe, moved chunk by chunk through a few pinned buffers while the
host updates another chunk).

The file holds one record per chunk of `plan.strategies.offload.chunks`, at the chunk's `offset`:

    [master | m | v]     three fp32 runs of ⌈L⌉_1024 elements each (L: the chunk's elements)

so a chunk moves in one system call each way (`os.preadv` / `os.pwritev` scattering the record into,
or gathering it from, a buffer's three views). The host buffers live in one arena aligned to 4 KiB:
`buffer_count` slots of four fp32 views of C elements each (master, m, v, and the gradient chunk,
which never goes to disk). With `direct_io` the file is opened O_DIRECT, so the bytes go to the drive
and not to the page cache (ZeRO-Infinity's libaio path does the same); every offset, length and
address is then a multiple of 4 KiB, which the layout guarantees.

All reads and writes run on one I/O thread, in the order they are queued (the FIFO the planner's
`plan.strategies.swap_pipeline.swap_seconds` models). The system calls release the GIL, so the host's update runs
meanwhile. The file is created with O_EXCL under a name holding the rank and the process id, its
space reserved at once (a full drive fails here, not mid-step), and removed at `close` (or when the
object is collected, or the process exits). `SwapIO`, the file and its thread, also holds
`offload_params.ParamStore`'s weight shards.
"""

from __future__ import annotations

import errno
import itertools
import os
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ringzero.plan.strategies import offload as plan
from ringzero.parallel.offload.config import direct_flag
from ringzero.plan.strategies.offload import ALIGN_BYTES, DEFAULT_BUFFER_NUMEL, FP32, SLOT_KINDS, STATE_KINDS, Chunk

_serial = itertools.count()


@dataclass(frozen=True)
class Slot:
    """One swap buffer: fp32 views of C elements each, and the byte views of the three that move."""

    w: torch.Tensor
    m: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    io: tuple[memoryview, memoryview, memoryview]


def aligned_empty(nbytes: int, pin_memory: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the allocation, its `nbytes` starting at a 4 KiB boundary): direct I/O needs aligned
    addresses, and torch's allocators only promise 64 bytes, so ALIGN_BYTES extra are allocated."""
    raw = torch.empty(nbytes + ALIGN_BYTES, dtype=torch.uint8, pin_memory=pin_memory)
    shift = -raw.data_ptr() % ALIGN_BYTES
    return raw, raw[shift:shift + nbytes]


def _after(views: list[memoryview], skip: int) -> list[memoryview]:
    """`views` less their first `skip` bytes."""
    out = []
    for v in views:
        if skip >= v.nbytes:
            skip -= v.nbytes
            continue
        out.append(v[skip:])
        skip = 0
    return out


def transfer(op, fd: int, views: list[memoryview], offset: int) -> int:
    """Run `op` (os.preadv or os.pwritev) until every byte of `views` moved; returns the bytes moved
    (a regular file may move fewer per call than asked)."""
    want, done = sum(v.nbytes for v in views), 0
    while done < want:
        n = op(fd, _after(views, done), offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"swap file {op.__name__} stopped after {done} of {want} bytes at offset {offset}")
        done += n
    return done


def _release(pool: ThreadPoolExecutor, fd: int, path: str) -> None:
    pool.shutdown(wait=True)
    os.close(fd)
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class SwapIO:
    """A file of `size` bytes under `directory`, its space reserved, and the one I/O thread that
    moves bytes between it and host memory, in the order asked (see the module doc)."""

    def __init__(self, directory: str, name: str, size: int, direct_io: bool) -> None:
        self.path = os.path.join(directory, f"ringzero-{name}-pid{os.getpid()}-{next(_serial)}.swap")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | direct_flag(direct_io), 0o600)
        self.fd, self.pool = fd, ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"swap-{name}")
        self._finalizer = weakref.finalize(self, _release, self.pool, fd, self.path)
        if size:
            os.posix_fallocate(fd, 0, size)

    def read(self, views: list[memoryview], offset: int) -> Future:
        """Queue a read of the file at `offset` into `views`; the future gives the bytes read."""
        return self.pool.submit(transfer, os.preadv, self.fd, views, offset)

    def write(self, views: list[memoryview], offset: int) -> Future:
        """Queue a write of `views` to the file at `offset`; the future gives the bytes written."""
        return self.pool.submit(transfer, os.pwritev, self.fd, views, offset)

    def disk_bytes(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        """Wait for queued I/O, close and remove the file (idempotent)."""
        self._finalizer()


class SwapFile:
    """The optimizer records of `chunks` in a `SwapIO` file, and `buffer_count` slots of
    `chunk_numel` elements per view to move them through (see the module doc)."""

    def __init__(self, directory: str, name: str, chunks: list[Chunk], chunk_numel: int, buffer_count: int,
                 pin_memory: bool, direct_io: bool) -> None:
        self.io = SwapIO(directory, f"optimizer-{name}", sum(k.record_bytes for k in chunks), direct_io)
        c = chunk_numel
        self.raw, arena = aligned_empty(buffer_count * SLOT_KINDS * FP32 * c, pin_memory)
        floats, data = arena.view(torch.float32).view(buffer_count, SLOT_KINDS, c), memoryview(arena.numpy())
        step = FP32 * c
        self.slots = [Slot(*floats[i], io=tuple(data[(i * SLOT_KINDS + j) * step:(i * SLOT_KINDS + j + 1) * step]
                                                for j in range(STATE_KINDS)))
                      for i in range(buffer_count)]

    def _views(self, k: Chunk, slot: int) -> list[memoryview]:
        n = FP32 * k.record_numel
        return [v[:n] for v in self.slots[slot].io]

    def read(self, k: Chunk, slot: int) -> Future:
        """Queue the read of chunk `k`'s record into slot `slot`; the future gives the bytes read."""
        return self.io.read(self._views(k, slot), k.offset)

    def write(self, k: Chunk, slot: int) -> Future:
        """Queue the write of slot `slot` to chunk `k`'s record; the future gives the bytes written."""
        return self.io.write(self._views(k, slot), k.offset)

    def measure(self, chunks: list[Chunk], load=None) -> dict[str, float]:
        """{"write_gbps", "read_gbps"} (10⁹ bytes/s) of moving the records of `chunks` in the swap
        loop's order (reads of the first B, then each write followed by the read into the slot it
        frees), each system call timed on the I/O thread. Each write puts back the record its slot
        holds, so the file keeps its contents: this can measure a live optimizer's own file.

        With `load` (a callable), this thread calls it over and over while the I/O runs, as the
        host's update runs beside the swap, and "load_s" (seconds per call meanwhile) joins the
        result: both sides of the interference of cores shared by I/O and update."""
        b = len(self.slots)
        ops = [(os.preadv, k, i) for i, k in enumerate(chunks[:b])]
        for i, k in enumerate(chunks):
            ops.append((os.pwritev, k, i % b))
            if i + b < len(chunks):
                ops.append((os.preadv, chunks[i + b], i % b))
        timed = self.io.pool.submit(_timed, self.io.fd, [(op, self._views(k, slot), k.offset) for op, k, slot in ops])
        calls, t0 = 0, time.perf_counter()
        while load is not None and (not timed.done() or calls == 0):
            load()
            calls += 1
        busy = time.perf_counter() - t0
        moved, seconds = timed.result()
        out = {"write_gbps": moved[os.pwritev] / seconds[os.pwritev] / 1e9,
               "read_gbps": moved[os.preadv] / seconds[os.preadv] / 1e9}
        return out if load is None else {**out, "load_s": busy / calls}

    def host_bytes(self) -> int:
        return self.raw.numel()

    def disk_bytes(self) -> int:
        return self.io.disk_bytes()

    def close(self) -> None:
        self.io.close()


def _timed(fd: int, ops: list) -> tuple[dict, dict]:
    """Run (os.preadv or os.pwritev, views, offset) in order; bytes and seconds per system call kind."""
    moved, seconds = {os.preadv: 0, os.pwritev: 0}, {os.preadv: 0.0, os.pwritev: 0.0}
    for op, views, offset in ops:
        t0 = time.perf_counter()
        moved[op] += transfer(op, fd, views, offset)
        seconds[op] += time.perf_counter() - t0
    return moved, seconds


def probe_disk(path: str, nbytes: int = 64 << 20, buffer_numel: int = DEFAULT_BUFFER_NUMEL,
               buffer_count: int = 4, direct_io: bool = True) -> dict[str, float]:
    """{"write_gbps", "read_gbps"} (10⁹ bytes/s) of a new swap file under `path`, moved as the
    swapper moves it: records of `buffer_numel` elements per kind through `buffer_count` buffers and
    a `SwapFile`'s I/O thread, in the swap loop's order (`SwapFile.measure`). One untimed pass fills
    the file first, so the timed writes overwrite, as every step does (a first write into reserved
    space also converts extents). The bytes are random, as optimizer states are: a drive or virtual
    disk may treat zero blocks apart (here a file of zeros moved at 0.6-1.3 GB/s, random bytes at
    1.5-2 GB/s: `python -c "from ringzero.parallel.offload.nvme_swap import probe_disk;
    print(probe_disk('/tmp'))"`, and the same with the `random_(...)` fill below as `zero_()`). About 0.2 s
    at 1 GB/s with the default size."""
    n = -(-nbytes // (STATE_KINDS * FP32))
    chunks = plan.chunks([n], buffer_numel)
    swap = SwapFile(path, "probe", chunks, plan.chunk_numel([n], buffer_numel), min(buffer_count, len(chunks)),
                    False, direct_io)
    try:
        swap.raw.random_(generator=torch.Generator().manual_seed(0))
        for i, k in enumerate(chunks):
            swap.write(k, i % len(swap.slots)).result()
        return swap.measure(chunks)
    finally:
        swap.close()
