"""torch's own tensor parallelism on ringzero's GPT: the peer `ringzero bench train --tp` runs against.

`parallelize_module` with `ColwiseParallel` on qkv and the first MLP matrix and `RowwiseParallel` on
the two output projections (torch's tensor-parallel tutorial, after Shoeybi et al. 2019 §3). The
fused qkv rows are reordered first, so that torch's contiguous split hands each rank whole heads of
q, k and v as ringzero's split by heads does: both then compute the same model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_dtensor(t) -> bool:
    return hasattr(t, "to_local")


def clip_grad_norm(params, clip: float, group) -> None:
    """`clip_grad_norm_` for a mix of split (DTensor) and replicated parameters, which torch's own
    refuses to mix: split gradients' squares summed over the ranks, replicated ones counted once."""
    grads = [p.grad for p in params if p.grad is not None]
    split = [g.to_local() for g in grads if is_dtensor(g) and g.placements[0].is_shard()]
    whole = [g.to_local() if is_dtensor(g) else g for g in grads
             if not (is_dtensor(g) and g.placements[0].is_shard())]   # a row-parallel bias: Replicate
    sq = torch.stack([g.square().sum() for g in split]).sum() if split else torch.zeros(())
    dist.all_reduce(sq, group=group)
    if whole:
        sq = sq + torch.stack([g.square().sum() for g in whole]).sum()
    coef = clip / (float(sq.sqrt()) + 1e-6)
    if coef < 1:
        torch._foreach_mul_(split + whole, coef)


def parallelize(model, group):
    """`model` split by torch's `parallelize_module` over every rank of `group` (see the module doc)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = DeviceMesh.from_group(group, "cpu")
    t = mesh.size()
    with torch.no_grad():
        for block in model.blocks:
            qkv = block.attn.qkv                 # rows [q; k; v] -> [q_0 k_0 v_0; q_1 k_1 v_1; ...]
            for p in (qkv.weight, qkv.bias):
                if p is not None:
                    p.copy_(p.view(3, t, -1, *p.shape[1:]).transpose(0, 1).reshape(p.shape))
    styles = {"attn.qkv": ColwiseParallel, "attn.proj": RowwiseParallel, "mlp.fc": ColwiseParallel,
              "mlp.proj": RowwiseParallel}
    plan = {f"blocks.{i}.{name}": style() for i in range(len(model.blocks)) for name, style in styles.items()}
    return parallelize_module(model, mesh, plan)
