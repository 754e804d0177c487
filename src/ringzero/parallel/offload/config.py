"""Where offloaded states live and whether this machine can hold them: the offload's typed config
(`OffloadConfig`, validated at construction) and the checks made before any rank starts (host
memory, the swap folder, direct I/O). torch-free, so that a run's bad offload input is refused
before torch is imported."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Sequence

from ringzero.plan.strategies import offload as plan
from ringzero.plan.strategies.offload import ALIGN_NUMEL, DEFAULT_BUFFER_NUMEL, OffloadDevice, Placement

GiB = 2**30


def direct_flag(direct_io: bool) -> int:
    if direct_io and not hasattr(os, "O_DIRECT"):
        raise ValueError("direct_io needs O_DIRECT, which this system lacks; set direct_io=False")
    return os.O_DIRECT if direct_io else 0



@dataclass(frozen=True, kw_only=True)
class OffloadConfig:
    """Where the optimizer's states live, and how they are streamed."""

    device: OffloadDevice = OffloadDevice.NONE
    """none: beside the weights; cpu: host memory (ZeRO-Offload); nvme: a file under nvme_path
    (ZeRO-Infinity). A string is accepted."""
    nvme_path: str | None = None
    """Directory of the swap files (device nvme only)."""
    buffer_count: int = 4
    """Swap buffers (nvme): the I/O thread reads up to buffer_count - 1 chunks ahead (DeepSpeed's
    default for the optimizer is 4). At least 2, so that I/O overlaps the update."""
    buffer_numel: int = DEFAULT_BUFFER_NUMEL
    """Elements per chunk at most (cpu, nvme), a multiple of 1024; smaller when every shard is."""
    pin_memory: bool = True
    """Page-lock host states and buffers for DMA with a GPU (unused when the weights are on the host)."""
    direct_io: bool = True
    """Open the swap files O_DIRECT (nvme): bytes go to the drive, not to the page cache."""

    def __post_init__(self) -> None:
        if not isinstance(self.device, OffloadDevice):
            allowed = [d.value for d in OffloadDevice]
            if self.device not in allowed:
                raise ValueError(f"offload device must be one of {', '.join(allowed)}, got {self.device!r}")
            object.__setattr__(self, "device", OffloadDevice(self.device))
        nvme = self.device is OffloadDevice.NVME
        if nvme and not self.nvme_path:
            raise ValueError("offload device 'nvme' needs nvme_path, a writable directory for the swap files")
        if not nvme and self.nvme_path is not None:
            raise ValueError(f"nvme_path is only used with offload device 'nvme', not {self.device.value!r}")
        if isinstance(self.buffer_count, bool) or not isinstance(self.buffer_count, int) or self.buffer_count < 2:
            raise ValueError(f"buffer_count must be an integer >= 2 (one buffer is updated while another "
                             f"is read or written), got {self.buffer_count!r}")
        if (isinstance(self.buffer_numel, bool) or not isinstance(self.buffer_numel, int)
                or self.buffer_numel <= 0 or self.buffer_numel % ALIGN_NUMEL):
            raise ValueError(f"buffer_numel must be a positive multiple of {ALIGN_NUMEL} (4 KiB of fp32, for "
                             f"direct I/O and exact chunked updates), got {self.buffer_numel!r}")

    def needs(self, shards: Sequence[int], weight_bytes: int) -> Placement:
        """Bytes by location an optimizer over shards of `shards` elements will allocate (the twin
        of `placement_bytes`), before allocating anything."""
        return plan.placement(self.device, shards, weight_bytes, self.buffer_count, self.buffer_numel)


def available_host_bytes() -> int | None:
    """Host memory available to new allocations: psutil's figure, else /proc/meminfo's MemAvailable;
    None where neither exists."""
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_directory(path: str, direct_io: bool) -> None:
    """One-line error unless `path` is a directory this process can create files in (and open them
    O_DIRECT, with `direct_io`)."""
    if not os.path.exists(path):
        raise ValueError(f"nvme_path {path!r} does not exist")
    if not os.path.isdir(path):
        raise ValueError(f"nvme_path {path!r} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix="ringzero-check-", dir=path)
    except OSError as e:
        raise ValueError(f"nvme_path {path!r} is not writable ({e.strerror})") from None
    os.close(fd)
    try:
        os.close(os.open(probe, os.O_RDWR | direct_flag(direct_io)))
    except OSError as e:
        raise ValueError(f"nvme_path {path!r} does not support direct I/O ({e.strerror}); "
                         f"set direct_io=False") from None
    finally:
        os.remove(probe)


def check_offload(config: OffloadConfig, host_bytes: int, disk_bytes: int) -> None:
    """Before any rank starts: a one-line error when the host lacks `host_bytes` of available memory,
    or, for nvme, `nvme_path` is unusable or has less than `disk_bytes` free. The caller sums
    `config.needs(...)` over the ranks that share this host and this drive."""
    if config.device is OffloadDevice.NONE:
        return
    free = available_host_bytes()
    if free is not None and host_bytes > free:
        raise ValueError(f"offload {config.device.value} needs {host_bytes / GiB:.2f} GiB of host memory "
                         f"for the optimizer, only {free / GiB:.2f} GiB is available")
    if config.device is OffloadDevice.NVME:
        check_directory(config.nvme_path, config.direct_io)
        room = shutil.disk_usage(config.nvme_path).free
        if disk_bytes > room:
            raise ValueError(f"nvme_path {config.nvme_path!r} has {room / GiB:.2f} GiB free, the optimizer's "
                             f"swap files need {disk_bytes / GiB:.2f} GiB")
