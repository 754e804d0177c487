"""What a checkpoint shard's CRC-32 costs beside writing it.

Writes shards of GPT-2's size per rank (124M parameters in fp32 with Adam's two moments on 2
ranks: ~740 MB each) and smaller ones the way `checkpoint.save.write` does (safetensors, then
fsync), sums them after the write (`checkpoint.folders.summed`: size and CRC-32, read back through
the page cache), then writes them again with the sum beside the fsync, as a save does
(`checkpoint.save.synced_and_summed`), and prints the median of each over `--repeat` rounds.

    python benchmarks/bench_checksum.py [--sizes-mib 64,256,740] [--repeat 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
from safetensors.torch import save_file

from ringzero.checkpoint.folders import summed
from ringzero.checkpoint.save import synced_and_summed


def one(size_mib: int, folder: str) -> tuple[float, float, float]:
    """(write + fsync, size + CRC-32 after it, write + fsync with the sum beside the fsync) seconds."""
    tensors = {f"param/w{i}": torch.randn(size_mib * 2**20 // 4 // 8) for i in range(8)}
    path = os.path.join(folder, "rank-00000.safetensors")
    t0 = time.perf_counter()
    save_file(tensors, path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    t1 = time.perf_counter()
    summed(path)
    t2 = time.perf_counter()
    os.unlink(path)
    t3 = time.perf_counter()
    save_file(tensors, path)
    synced_and_summed(path)            # what `checkpoint.save.write` does
    t4 = time.perf_counter()
    os.unlink(path)
    return t1 - t0, t2 - t1, t4 - t3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="64,256,740")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for size in (int(s) for s in args.sizes_mib.split(",")):
            rounds = [one(size, folder) for _ in range(args.repeat)]
            write, crc, both = (statistics.median(r[i] for r in rounds) for i in range(3))
            print(f"{size:5d} MiB shard: write + fsync {write * 1e3:7.0f} ms; size + CRC-32 after it {crc * 1e3:6.0f} ms "
                  f"({crc / write * 100:.0f} %); beside the fsync, as saved: {both * 1e3:7.0f} ms "
                  f"({(both - write) / write * 100:+.0f} % on the write)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
