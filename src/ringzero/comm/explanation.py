"""The data of `ringzero explain`: one symbolic run of a collective algorithm.

Built by `ringzero.comm.explain`, formatted by `ringzero.comm.explain_render`; both import it from
here, so that the formatting does not reach back into the module that runs the algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringzero.comm.symbolic import Message

ITEMSIZE = 4
"""float32: the element size of the planner's totals and of their `--json` fields."""


@dataclass(frozen=True)
class Explanation:
    """A symbolic run of one collective algorithm."""

    collective: str
    algorithm: str
    world: int
    root: int
    ranks_per_node: int | None
    summary: str
    """First line of the algorithm's docstring."""
    initial: tuple[tuple, ...]
    """Per rank, the input buffer (for all_to_all the send buffer)."""
    messages: tuple[Message, ...]
    """Every message, sorted by (step, src, dst)."""
    holdings: tuple[tuple[tuple, ...], ...]
    """holdings[s - 1][r]: rank r's buffer after step s (for all_to_all the receive buffer)."""
    final: tuple[tuple, ...]
    """Per rank, the buffer when the algorithm returned."""
    rounds: tuple[int, ...]
    """Per rank, rounds as the traffic meter counts them."""

    @property
    def steps(self) -> int:
        return len(self.holdings)

    def messages_at(self, step: int) -> list[Message]:
        return [m for m in self.messages if m.step == step]
