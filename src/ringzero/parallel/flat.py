"""Parameters stored as views of one flat buffer, cut into equal shards (ZeRO, FSDP's FlatParameter).

A bucket of parameters p_0..p_k (one dtype) lives in one buffer of `padded` elements, p_i at
[offset_i, offset_i + numel_i); the tail is zero padding so that the buffer splits into `shards`
equal pieces, ceil(numel / shards) each (ZeRO pads the same way; `plan.strategies.sharding.shard_numel`,
the planner's count). Rank r owns [r·shard, (r+1)·shard). Collectives then move one contiguous
tensor per bucket, and a rank's optimizer works on its slice.
"""

from __future__ import annotations

import torch

from ringzero.plan.strategies.sharding import shard_numel


class FlatBucket:
    """Parameters `params` (same dtype and device) laid out in one padded flat buffer."""

    def __init__(self, params: list[torch.nn.Parameter], shards: int, index: int) -> None:
        if not params:
            raise ValueError("a bucket needs at least one parameter")
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"a bucket holds one dtype, got {sorted(map(str, dtypes))}")
        self.params = list(params)
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets = [0]
        for n in self.numels:
            self.offsets.append(self.offsets[-1] + n)
        self.numel = self.offsets[-1]
        self.shards = shards
        self.shard = shard_numel(self.numel, shards)
        self.padded = self.shard * shards
        self.lo, self.hi = index * self.shard, (index + 1) * self.shard
        self.dtype, self.device = params[0].dtype, params[0].device

    def empty(self, dtype: torch.dtype | None = None, shard: bool = False) -> torch.Tensor:
        """A zeroed buffer of the whole bucket (or of one shard)."""
        return torch.zeros(self.shard if shard else self.padded, dtype=dtype or self.dtype, device=self.device)

    def gather_params(self) -> torch.Tensor:
        """A new flat buffer holding the parameters' current values (padding zero)."""
        flat = self.empty()
        for p, lo, n in zip(self.params, self.offsets, self.numels):
            flat[lo:lo + n].copy_(p.detach().reshape(-1))
        return flat

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of `flat` shaped like each parameter."""
        return [flat[lo:lo + n].view(shape) for lo, n, shape in zip(self.offsets, self.numels, self.shapes)]

    def bind(self, flat: torch.Tensor) -> None:
        """Make every parameter a view of `flat` (no copy)."""
        for p, v in zip(self.params, self.views(flat)):
            p.data = v

    def unbind(self) -> None:
        """Drop the parameters' storage (ZeRO-3 between uses); the Parameter objects stay."""
        for p in self.params:
            p.data = torch.empty(0, dtype=self.dtype, device=self.device)

    def slot(self, i: int, flat: torch.Tensor) -> torch.Tensor:
        """Parameter i's slice of a flat buffer, flat."""
        return flat[self.offsets[i]:self.offsets[i + 1]]
