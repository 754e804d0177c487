"""The interface of a communication hook, the start step, and the staged state hooks keep.

A hook's state (an error-feedback residual, PowerSGD's Q) changes with every reduction, but a step
the loss scaler skips for an fp16 overflow must leave it as it was, and the reduction happens
before anyone knows the step will be skipped: so a reduction stages the new state and the step's
end settles it (`Residuals.settle`). A residual holds gradients at the loss scale of its step, so
settling also rescales it to the next step's scale.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ringzero.parallel.compression.bucket import GradBucket


class CommHook(Protocol):
    """A bucket's reduction over the dp ranks (see the package doc)."""

    name: str
    scatters: bool
    """Under ZeRO-1/2, whether it fills the bucket's shard itself (a 16-bit reduce-scatter); if
    not, it leaves the whole sum in the buffer and the strategy keeps its shard of it."""
    stateful: bool
    active: bool
    """False before its start step: the strategy runs its own plain reduction."""

    @property
    def compression(self):
        """The planner's description of it (a `plan.strategies.compression.Compression`)."""

    def reduce(self, bucket: GradBucket, link) -> None:
        """Sum `bucket.buffer[:numel]` over the ranks in place (or fill `bucket.shard`)."""

    def settle(self, skipped: bool, rescale: float = 1.0) -> None:
        """The step ended: keep the staged state (drop it when `skipped`), times `rescale`."""

    def set_step(self, step: int) -> None:
        """The next step is `step` (a resumed run)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        ...

    def state_bytes(self) -> dict[str, int]:
        """Bytes kept between steps: {"residual", "q"}."""

    def fresh(self) -> "CommHook":
        """The same scheme with no state (what the probe times)."""


def residual_of(t: torch.Tensor) -> torch.Tensor:
    """A new residual holding `t`: fp32 when `t` is fp16 (`plan.strategies.compression.residual_itemsize`)."""
    return t.float() if t.dtype == torch.float16 else t.clone()


class Residuals:
    """Tensors kept per bucket between steps under `name`, staged until the step settles."""

    def __init__(self, name: str, rescaled: bool = True) -> None:
        self.name, self.rescaled = name, rescaled
        self.kept: dict[int, torch.Tensor] = {}
        self.staged: dict[int, torch.Tensor] = {}

    def get(self, index: int) -> torch.Tensor | None:
        return self.kept.get(index)

    def stage(self, index: int, t: torch.Tensor) -> None:
        self.staged[index] = t

    def settle(self, skipped: bool, rescale: float = 1.0) -> None:
        if not skipped:
            self.kept.update(self.staged)
        self.staged.clear()
        if self.rescaled and rescale != 1.0:
            for t in self.kept.values():
                t.mul_(rescale)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"{self.name}.{i}": t for i, t in self.kept.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        prefix = self.name + "."
        self.kept = {int(k[len(prefix):]): v.clone() for k, v in state.items() if k.startswith(prefix)}
        self.staged.clear()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kept.values())


class Starting:
    """`inner`, active from step `start` on; the strategy's plain reduction before it."""

    def __init__(self, inner: CommHook, start: int) -> None:
        self.inner, self.start, self.step = inner, start, 0
        self.name, self.scatters, self.stateful = inner.name, inner.scatters, inner.stateful

    @property
    def active(self) -> bool:
        return self.step >= self.start

    @property
    def compression(self):
        return self.inner.compression

    def reduce(self, bucket: GradBucket, link) -> None:
        self.inner.reduce(bucket, link)

    def settle(self, skipped: bool, rescale: float = 1.0) -> None:
        if self.active:
            self.inner.settle(skipped, rescale)
        self.step += 1

    def set_step(self, step: int) -> None:
        self.step = step

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self.inner.state_dict(), "step": torch.tensor([self.step])}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if "step" in state:
            self.step = int(state["step"][0])
        self.inner.load_state_dict({k: v for k, v in state.items() if k != "step"})

    def state_bytes(self) -> dict[str, int]:
        return self.inner.state_bytes()

    def fresh(self) -> CommHook:
        return self.inner.fresh()
