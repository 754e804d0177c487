"""A strategy-selection flow, answered with this model's numbers.

    fits on one GPU?                      yes -> data parallel (DP)
    memory mostly optimizer states?       yes -> ZeRO-1/2 (the lowest stage that fits;
                                                 ZeRO-3 when only it fits, Rajbhandari et al. 2020)
    one layer fits on one GPU?            yes -> pipeline parallel, no -> tensor parallel
    very large (no data-parallel-only     yes -> 3D: TP inside the node on NVLink, PP across
    layout fits)?                                adjacent nodes, DP between nodes (Narayanan et al. 2021 §3)

Each answer is computed with `plan.strategies.memory` for the given training setup (micro-batch, precision,
recomputation), so "fits" includes activations and buffers, not only the 16Ψ of model states.
`search` ranks every layout by time; this is the readable first answer. `engine_layout` is the
search's answer restricted to what ringzero's own engine runs (`engine_runs`), for
`ringzero train --layout auto`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ringzero.plan.search import limits
from ringzero.plan.config import Parallel, Training
from ringzero.plan.hardware import Hardware
from ringzero.plan.strategies.memory import Memory, memory, state_bytes
from ringzero.plan.pipeline.schedule import SCHEDULES
from ringzero.plan.search.space import Space, label, search
from ringzero.plan.model.shapes import ModelShape, param_count
from ringzero.plan.words import gpus as _gpus

GB = 1e9


@dataclass(frozen=True)
class Recommendation:
    steps: list[tuple[str, str, str]]
    """(question, answer, because) for each decision taken, in order."""
    strategy: str
    """The layout the flow ends at, in words."""
    parallel: Parallel | None
    """That layout as a `Parallel` (None when nothing fits on this many GPUs)."""


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _fits(m: ModelShape, tr: Training, par: Parallel, hw: Hardware) -> tuple[bool, Memory]:
    mem = memory(m, tr, par)
    return mem.total <= hw.hbm_bytes, mem


def _three_d(m: ModelShape, tr: Training, hw: Hardware, gpus: int, base: dict) -> Parallel | None:
    """The least model parallelism that makes ZeRO-1 fit: tensor parallel inside a node first
    (Narayanan et al. 2021 §3: TP on NVLink), then pipeline stages; DP takes the remaining GPUs."""
    tps = [t for t in range(1, min(hw.gpus_per_node, gpus) + 1)
           if m.heads % t == 0 and m.kv % t == 0 and gpus % t == 0]
    pps = [p for p in range(1, m.layers + 1) if m.layers % p == 0 and gpus % p == 0]
    grid = sorted(((tp, pp) for tp in tps for pp in pps if gpus % (tp * pp) == 0 and tp * pp > 1),
                  key=lambda c: (c[0] * c[1], c[1]))
    for tp, pp in grid:
        dp = gpus // (tp * pp)
        par = Parallel(dp=dp, tp=tp, pp=pp, zero=1 if dp > 1 else 0, sequence_parallel=tp > 1, **base)
        if _fits(m, tr, par, hw)[0]:
            return par
    return None


def _layout(par: Parallel) -> str:
    parts = []
    if par.tp > 1:
        parts.append(f"tp={par.tp} inside a node on NVLink")
    if par.pp > 1:
        parts.append(f"pp={par.pp} stages of adjacent layers")
    if par.dp > 1:
        parts.append(f"dp={par.dp} replicas" + (f" with ZeRO-{par.zero}" if par.zero else ""))
    return ", ".join(parts)


def recommend(m: ModelShape, tr: Training, hw: Hardware, gpus: int, *, recompute: str = "selective",
              flash_attention: bool = False) -> Recommendation:
    """Walk the module doc's flow for `m` trained as `tr` on `gpus` GPUs of `hw`."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    limits.check(m.layers, gpus)
    base = dict(recompute=recompute, flash_attention=flash_attention)
    tr = Training(micro_batch=tr.micro_batch, precision=tr.precision, optimizer=tr.optimizer,
                  dropout=tr.dropout)
    n = param_count(m).total
    steps = []
    ok, mem = _fits(m, tr, Parallel(**base), hw)
    steps.append(("Does the model fit on one GPU?", "yes" if ok else "no",
                  f"{_gb(mem.model_states)} of model states + {_gb(mem.activations)} activations "
                  f"+ {_gb(mem.buffers)} buffers vs {_gb(hw.hbm_bytes)} HBM"))
    if ok:
        par = Parallel(dp=gpus, **base)
        return Recommendation(steps, f"data parallel over {_gpus(gpus)} (ring all-reduce)", par)
    sb = state_bytes(tr.precision, tr.optimizer)
    dominated = sb.optimizer > sb.weights + sb.grads
    steps.append(("Is memory mostly optimizer states?", "yes" if dominated else "no",
                  f"optimizer {sb.optimizer} B/param ({_gb(sb.optimizer * n)}) vs weights + grads "
                  f"{sb.weights + sb.grads} B/param ({_gb((sb.weights + sb.grads) * n)})"))
    if dominated:
        for stage in (1, 2, 3):
            ok, mem = _fits(m, tr, Parallel(dp=gpus, zero=stage, **base), hw)
            steps.append((f"Does ZeRO-{stage} over {_gpus(gpus)} fit?", "yes" if ok else "no",
                          f"{_gb(mem.total)} per GPU vs {_gb(hw.hbm_bytes)}"))
            if ok and (stage < 3 or gpus <= hw.gpus_per_node):
                return Recommendation(steps, f"ZeRO-{stage} over {_gpus(gpus)}",
                                      Parallel(dp=gpus, zero=stage, **base))
            if ok:
                steps.append(("Is ZeRO-3 alone the best answer across nodes?", "not necessarily",
                              "its 3Φ all-gathers and reduce-scatters cross the network every step; "
                              "3D parallelism with ZeRO-1 keeps the large traffic inside nodes (Narayanan et al. 2021 §3)"))
                break
    layer_bytes = param_count(m).per_layer * sb.total
    one_layer = layer_bytes <= hw.hbm_bytes
    steps.append(("Does one layer fit on one GPU?", "yes" if one_layer else "no",
                  f"{_gb(layer_bytes)} of model states per layer -> "
                  + ("pipeline parallel can split by layers" if one_layer else "tensor parallel must split layers")))
    par = _three_d(m, tr, hw, gpus, base)
    zero3 = Parallel(dp=gpus, zero=3, **base)
    if par is None and dominated and _fits(m, tr, zero3, hw)[0]:
        steps.append(("Is there a tensor x pipeline layout that fits?", "no",
                      f"no tp <= {hw.gpus_per_node} dividing the heads and pp dividing the layers fits; "
                      "ZeRO-3 does"))
        return Recommendation(steps, f"ZeRO-3 over {_gpus(gpus)}", zero3)
    if par is None:
        steps.append(("Is there a 3D layout that fits?", "no",
                      f"not with tensor parallel <= {hw.gpus_per_node} and ZeRO-1 on {_gpus(gpus)}"))
        return Recommendation(steps, f"nothing fits on {_gpus(gpus)}: add GPUs, recompute, or offload", None)
    steps.append(("Is model parallelism needed?", "yes",
                  f"{_layout(par)}: {_gb(memory(m, tr, par).total)} per GPU"))
    return Recommendation(steps, f"tp={par.tp} x pp={par.pp} x dp={par.dp}"
                          + (f", ZeRO-{par.zero}" if par.zero else ""), par)


ENGINE_SPACE = Space(recompute=("none",), sequence_parallel=(False,),
                     schedules=("1f1b",) + tuple(s for s in SCHEDULES if s != "1f1b"))
"""What `engine_layout` tries by default: every ZeRO stage and pipeline schedule (1F1B first: the
one kept without a pipeline, and on a tie); no recomputation and no sequence parallelism (the
run's own choices, which a caller passes in its `space`)."""


def engine_runs(m: ModelShape, par: Parallel) -> bool:
    """Whether ringzero's engine runs layout `par` of `m`: tp divides the heads, the kv heads and the
    MLP width (Megatron's column split, Shoeybi et al. 2019 §3), sequence parallelism splits the
    sequence evenly, pp <= layers, no offload, and ZeRO-2/3 only without a pipeline: they reduce
    the gradients of every micro-batch, which a pipeline's stages interleave (DeepSpeed's pipeline
    engine refuses them too)."""
    t = par.tp
    return (m.heads % t == 0 and m.kv % t == 0 and m.ffn_dim % t == 0 and par.pp <= m.layers
            and (not par.sequence_parallel or m.seq % t == 0) and par.offload == "none"
            and (par.pp == 1 or par.zero <= 1))


def engine_layout(m: ModelShape, tr: Training, world: int, hw: Hardware, *,
                  space: Space = ENGINE_SPACE) -> Parallel:
    """The dp x tp x pp layout (with ZeRO stage and pipeline schedule) of `world` ranks that the
    search ranks fastest among those that fit in `hw`'s memory and that ringzero's engine runs.

    Every layout runs `tr.micro_batch` sequences per micro-batch and the same global batch (the
    search's rule): `tr.global_batch`, or when None micro_batch x world, one micro-batch per rank
    under pure data parallelism; a layout's micro-batches per step are then
    `Training(..., global_batch=...).accumulation(dp)`, tp·pp of them when the global batch is
    micro_batch x world. Splits are the search's (tp <= world, pp dividing the layers); the
    interleaved schedule is tried with `space.virtual_stages` chunks per rank. A one-line
    ValueError when no layout fits.
    """
    space = dataclasses.replace(space, micro_batches=(tr.micro_batch,), offload=("none",),
                                max_tp=space.max_tp or world)
    found = search(m, tr, hw, world, space=space, top=1, keep=lambda par: engine_runs(m, par))
    if found.best:
        return found.best[0].parallel
    if found.closest is None:
        raise ValueError(f"no dp x tp x pp layout of {_gpus(world)} that ringzero's engine runs: tp must "
                         f"divide the {m.heads} heads and the MLP width {m.ffn_dim}, pp the {m.layers} layers, "
                         f"and micro-batch x dp the global batch of {found.global_batch}")
    c = found.closest
    raise ValueError(f"no layout of {m.name} fits on {_gpus(world)} of {hw.name}: the leanest, {label(c)}, "
                     f"needs {_gb(c.memory.total)} of {_gb(hw.hbm_bytes)}")
