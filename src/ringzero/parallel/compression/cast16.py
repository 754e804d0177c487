"""fp16 / bf16 compression: the bucket reduced in a 16-bit type (torch DDP's `fp16_compress_hook`
and `bf16_compress_hook`), half the bytes of an fp32 reduction.

The bucket is divided by the ranks before the sum, as in torch's hooks, and before the cast (torch
casts first), so neither the cast nor the 16-bit sum overflows where the mean would not; the same
values as torch's when the ranks are a power of two (the division is exact). Cast back, it is
multiplied by the ranks again (the strategies hand the optimizer sums).
"""

from __future__ import annotations

import torch

from ringzero.plan.strategies.compression import Compression
from ringzero.parallel.compression.bucket import GradBucket

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Cast16:
    scatters, stateful, active = True, False, True

    def __init__(self, kind: str) -> None:
        self.name, self.dtype = kind, DTYPES[kind]

    @property
    def compression(self) -> Compression:
        """The planner's description of this hook (`plan.strategies.compression`)."""
        return Compression(self.name)

    def reduce(self, bucket: GradBucket, link) -> None:
        n = link.world
        low = bucket.buffer.div_(n).to(self.dtype)          # (padded,) in 16 bits; the buffer is rewritten
        if bucket.shard is None:
            link.all_reduce(low)
            bucket.buffer.copy_(low).mul_(n)
        else:
            out = torch.empty(bucket.shard.numel(), dtype=self.dtype, device=low.device)
            link.reduce_scatter(out, low)
            bucket.shard.copy_(out).mul_(n)

    def settle(self, skipped: bool, rescale: float = 1.0) -> None:
        pass

    def set_step(self, step: int) -> None:
        pass

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        pass

    def state_bytes(self) -> dict[str, int]:
        return {"residual": 0, "q": 0}

    def fresh(self) -> "Cast16":
        return Cast16(self.name)
