"""A strategy-selection flow, answered with this model's numbers.

    fits on one GPU?                      yes -> data parallel (DP)
    memory mostly optimizer states?       yes -> ZeRO-1/2 (the lowest stage that fits;
                                                 ZeRO-3 when only it fits, Rajbhandari et al. 2020)
    one layer fits on one GPU?            yes -> pipeline parallel, no -> tensor parallel
    very large (no data-parallel-only     yes -> 3D: TP inside the node on NVLink, PP across
    layout fits)?                                adjacent nodes, DP between nodes (Narayanan et al. 2021 §3)

Each answer is computed with `plan.memory` for the given training setup (micro-batch, precision,
recomputation), so "fits" includes activations and buffers, not only the 16Ψ of model states.
`search` ranks every layout by time; this is the readable first answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import Parallel, Training
from .hardware import Hardware
from .memory import Memory, memory, state_bytes
from .shapes import ModelShape, param_count
from .words import gpus as _gpus

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
