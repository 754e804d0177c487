"""PowerSGD (Vogels et al. 2019, Algorithm 1 with error feedback, §3-4): each matrix-shaped gradient
M (n x m, a parameter viewed as (shape[0], rest)) is approximated by P·Qᵀ of rank r from one step
of power iteration, warm-started from the previous step's Q:

    M <- M + e                 (error feedback: the residual of the last step)
    P = M·Q, all-reduced; P orthogonalised (Gram-Schmidt; QR for r > 2, as torch's `_orthogonalize`)
    Q = Mᵀ·P, all-reduced, / ranks
    M ≈ P·Qᵀ                   the mean over the ranks' gradients; e = M_before - M ≈ kept

Parameters whose matrix would not shrink by `plan.strategies.compression.MIN_COMPRESSION_RATE`
(vectors, small matrices) go in one plain all-reduce first. The layout of P and Q (matrices grouped
by shape, in the order each shape first appears), the seeding of the first Q (a numpy
RandomState's draw seeding torch's generator per bucket) and the residual (the input minus the
mean) follow torch's `powerSGD_hook`, so the same gradients give the same P and Q. The bucket
leaves holding the sum (the mean x ranks), as every strategy's reduction does.
"""

from __future__ import annotations

import numpy as np
import torch

from ringzero.plan.strategies.compression import Compression, compresses, matrix
from ringzero.parallel.compression.bucket import GradBucket
from ringzero.parallel.compression.hook import Residuals, residual_of


def orthogonalize(m: torch.Tensor) -> None:
    """Orthonormal columns for each (n, r) matrix of the batch `m` (b, n, r), in place: QR for r > 2,
    Gram-Schmidt otherwise (torch's choice). A 16-bit batch is orthogonalised in fp32 and cast back:
    a column's squared norm of loss-scaled fp16 gradients overflows fp16 (65504) long before the
    gradients do (torch's hook keeps fp16 there and warns of it)."""
    if m.dtype in (torch.float16, torch.bfloat16):
        wide = m.float()
        orthogonalize(wide)
        m.copy_(wide)
        return
    b, _, r = m.shape
    if r > 2:
        torch.linalg.qr(m, out=(m, torch.empty(b, r, r, dtype=m.dtype, device=m.device)))
        return
    for i in range(r):
        col = m[:, :, i:i + 1]
        norm = torch.norm(col, dim=1, keepdim=True)
        col /= torch.where(norm == 0, 1.0, norm)      # a zero column stays zero (torch's turns to NaN)
        if i + 1 < r:
            rest = m[:, :, i + 1:]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col


class PowerSGD:
    name, scatters, stateful, active = "powersgd", False, True, True

    def __init__(self, rank: int = 4, seed: int = 0) -> None:
        self.rank, self.seed = rank, seed
        self.rng = np.random.RandomState(seed)
        self.residuals = Residuals("residual")
        self.qs = Residuals("q", rescaled=False)      # orthogonalised before use: scale-free

    @property
    def compression(self) -> Compression:
        return Compression("powersgd", rank=self.rank)

    def _layout(self, grads: list[torch.Tensor]):
        """(matrices to compress, grouped by shape in first-appearance order; the rest)."""
        by_shape: dict[torch.Size, list[torch.Tensor]] = {}
        plain = []
        for g in grads:
            mat = matrix(tuple(g.shape))
            if mat is not None and compresses(*mat, self.rank):
                v = g.view(mat)
                by_shape.setdefault(v.shape, []).append(v)
            else:
                plain.append(g)
        return [v for vs in by_shape.values() for v in vs], plain

    def reduce(self, bucket: GradBucket, link) -> None:
        world, i = link.world, bucket.index
        x = bucket.buffer[:bucket.numel]
        e = self.residuals.get(i)
        if e is not None:
            x.add_(e)
        before = residual_of(x)                    # M + e, to leave the residual in
        mats, plain = self._layout(bucket.gradients())
        ranks = [min(*m.shape, self.rank) for m in mats]
        p_mem = torch.empty(sum(m.shape[0] * r for m, r in zip(mats, ranks)), dtype=x.dtype, device=x.device)
        q_old = self.qs.get(i)
        q_mem = q_old.clone() if q_old is not None else \
            torch.empty(sum(m.shape[1] * r for m, r in zip(mats, ranks)), dtype=x.dtype, device=x.device)
        ps, qs, pi, qi = [], [], 0, 0
        for m, r in zip(mats, ranks):
            ps.append(p_mem[pi:pi + m.shape[0] * r].view(1, m.shape[0], r))
            qs.append(q_mem[qi:qi + m.shape[1] * r].view(1, m.shape[1], r))
            pi, qi = pi + m.shape[0] * r, qi + m.shape[1] * r
        self._start_qs(qs, fresh=q_old is None, dtype=x.dtype, shared=bucket.shared)
        for m, p, q in zip(mats, ps, qs):
            torch.bmm(m.unsqueeze(0), q, out=p)
        if plain:
            flat = torch.cat([g.reshape(-1) for g in plain])
            link.all_reduce(flat)
            flat.div_(world)
            at = 0
            for g in plain:
                g.copy_(flat[at:at + g.numel()].view_as(g))
                at += g.numel()
        if mats:
            link.all_reduce(p_mem)        # orthogonalised next: no need to divide
        for p in ps:
            orthogonalize(p)
        for m, p, q in zip(mats, ps, qs):
            torch.bmm(m.unsqueeze(0).transpose(1, 2), p, out=q)
        if mats:
            link.all_reduce(q_mem)
            q_mem.div_(world)
        for m, p, q in zip(mats, ps, qs):
            torch.bmm(p, q.transpose(1, 2), out=m.unsqueeze(0))
        self.residuals.stage(i, before.sub_(x))
        self.qs.stage(i, q_mem)
        self.last_p = p_mem                # the latest P, for the parity test with torch's hook
        x.mul_(world)

    def _start_qs(self, qs: list[torch.Tensor], fresh: bool, dtype: torch.dtype, shared: bool = False) -> None:
        """Warm start: the kept Q, orthogonalised; else standard normal draws from this hook's
        generator (the same on every rank: every rank seeds it alike), orthogonalised. A shared
        bucket (`GradBucket.shared`) draws from a seed of its own, not the generator's next draw,
        which counts the buckets before it (a pipeline's stages hold different ones)."""
        if not fresh:
            for q in qs:
                orthogonalize(q)
            return
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(np.random.RandomState([self.seed, 1]).randint(1_000_000_000) if shared
                              else self.rng.randint(1_000_000_000))
            for q in qs:
                q.copy_(torch.randn(*q.shape, device="cpu", dtype=dtype))
                orthogonalize(q)

    def settle(self, skipped: bool, rescale: float = 1.0) -> None:
        self.residuals.settle(skipped, rescale)
        self.qs.settle(skipped)

    def set_step(self, step: int) -> None:
        pass

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {**self.residuals.state_dict(), **self.qs.state_dict()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.residuals.load_state_dict(state)
        self.qs.load_state_dict(state)

    def state_bytes(self) -> dict[str, int]:
        return {"residual": self.residuals.nbytes(), "q": self.qs.nbytes()}

    def fresh(self) -> "PowerSGD":
        return PowerSGD(self.rank, self.seed)
