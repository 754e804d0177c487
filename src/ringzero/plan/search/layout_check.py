"""Whether a dp x tp x pp layout of a model can exist at all, before anything is priced.

The rules are Megatron-LM's, and ringzero's engine applies the same ones:

- tp divides the attention heads: the column-parallel QKV linear is split by heads, so each tp rank
  computes whole heads (Shoeybi et al. 2019 §3).
- tp divides the key/value heads under grouped-query attention: each rank holds whole KV groups
  (Megatron-LM divides its query groups by tp). Replicating KV heads when tp > kv_heads, as some
  inference engines do, is not modelled: the parameter and activation formulas split K and V by t.
- tp divides the MLP width: the first MLP matrix is split by columns (Shoeybi et al. 2019 §3).
- with sequence parallelism, tp divides the sequence length: each rank keeps s/t tokens of the
  norms and dropouts (Korthikanti et al. 2022 §4.2.2).
- pp is at most the number of layers: every stage holds at least one block. pp need not divide the
  layers: the blocks are cut by cost (`pipeline_layout.chunk_layers`) and the planner prices the
  busiest stage (`memory.memory`, `strategy_comm.tensor_parallel_ops`).

How many model chunks the schedule needs (pp x virtual stages) and how many micro-batches it runs
are the schedule's own rules (`pipeline.check`).
"""

from __future__ import annotations

import math

from ringzero.plan.config import Parallel
from ringzero.plan.model.shapes import ModelShape


def _divisors(n: int, start: int = 1) -> str:
    return ", ".join(str(d) for d in range(start, n + 1) if n % d == 0)


def problem(m: ModelShape, par: Parallel) -> str | None:
    """The first rule (see the module doc) the layout breaks, as a one-line message naming what is
    allowed; None when the layout can exist."""
    t, kv = par.tp, m.kv
    heads = math.gcd(m.heads, kv)
    if heads % t:
        of_kv = f" and the {kv} kv heads" if kv != m.heads else ""
        return f"tp={t} must divide the {m.heads} attention heads{of_kv}; allowed: {_divisors(heads)}"
    if m.ffn_dim % t:
        return (f"tp={t} must divide the MLP width ffn={m.ffn_dim}; allowed: "
                f"{_divisors(math.gcd(heads, m.ffn_dim))}")
    if par.sequence_parallel and m.seq % t:
        ok = _divisors(math.gcd(heads, m.ffn_dim, m.seq), start=2)
        return (f"sequence_parallel needs tp={t} to divide the sequence length {m.seq}; allowed: "
                + (f"tp in {ok}, or " if ok else "") + "no sequence parallelism")
    if par.pp > m.layers:
        return f"pp={par.pp} is more stages than the {m.layers} layers; allowed: 1-{m.layers}"
    return None


def check(m: ModelShape, par: Parallel) -> None:
    """A one-line ValueError when the layout cannot exist (`problem`)."""
    message = problem(m, par)
    if message is not None:
        raise ValueError(message)
