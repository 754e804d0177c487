"""One full-model safetensors file from a sharded checkpoint, written tensor by tensor.

safetensors' own `save_file` takes every tensor at once (a whole model in memory, the failure
DeepSpeed's zero_to_fp32 is known for). The format is simple enough to stream: an 8-byte
little-endian header length, a JSON header giving each tensor's dtype, shape and byte range, then
the bytes in that order. Every shape and dtype is in the manifest, so the header is written first
and each global tensor is assembled, written and dropped in turn: peak memory is about one global
tensor and the pieces it is read from.

Weights take their fp32 master when a 16-bit run saved one (what `zero_to_fp32` gives), under the
model's own parameter names, so `safetensors.torch.load_file` and `model.load_state_dict` read the
file as it is; `with_optimizer` adds "exp_avg/<name>" and "exp_avg_sq/<name>".
"""

from __future__ import annotations

import json
import math
import struct

import torch

from ringzero.checkpoint.load import Reader, source

CODES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def plan(reader: Reader, with_optimizer: bool) -> list[tuple[str, str]]:
    """(name in the file, tensor of the checkpoint) in the order written."""
    m = reader.manifest
    out = []
    for name in sorted(m.tensors):
        kind, _, param = name.partition("/")
        if kind == "param":
            out.append((param, source(m, name)))
        elif with_optimizer and kind in ("exp_avg", "exp_avg_sq"):
            out.append((name, name))
    return out


def header(reader: Reader, entries: list[tuple[str, str]]) -> bytes:
    m = reader.manifest
    head: dict = {"__metadata__": {"format": "ringzero.consolidated/1", "step": str(m.step),
                                   "optimizer_step": str(m.optimizer_step)}}
    at = 0
    for out_name, src in entries:
        e = m.tensors[src]
        n = math.prod(e.shape) * ITEMSIZE[e.dtype]
        head[out_name] = {"dtype": CODES[e.dtype], "shape": list(e.shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)                     # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


def consolidate(directory: str, out, with_optimizer: bool = False) -> int:
    """Write checkpoint `directory` as one safetensors stream to the binary file `out`; returns the
    tensors written."""
    reader = Reader(directory)
    entries = plan(reader, with_optimizer)
    out.write(header(reader, entries))
    for _, src in entries:
        t = reader.tensor(src).contiguous()
        out.write(memoryview(t.view(-1).view(torch.uint8).numpy()))     # no copy of the tensor
        del t
    return len(entries)
