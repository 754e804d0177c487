"""ringzero's compression hooks against torch DDP's comm hooks, on 2 and 4 ranks of the session pool.

- fp16 / bf16: `Cast16` through ringzero's collectives ("torch", "ring") vs torch's
  `fp16_compress_hook` / `bf16_compress_hook` on the same bucket: ours / ranks is torch's mean,
  bit for bit with the backend's own all-reduce, within the 16-bit sum's rounding with the ring;
- PowerSGD (Vogels et al. 2019, Algorithm 1): `Starting(PowerSGD(R), 2)` vs torch's `powerSGD_hook`
  with error feedback and warm start over 5 steps and 2 buckets: P, Q, the residual and the output
  after every compressed step, R = 1, 2 (Gram-Schmidt) and 4 (QR);
- top-k (Stich et al. 2018), no torch peer: f = 1 is the plain sum exactly; for f < 1 the output
  is the sum of every rank's kept entries and gradient + old residual = kept + new residual;
- a step the loss scaler skips (`settle(True)`) leaves the residuals and Q as they were;
- an inf on one rank reaches every rank's output (fp16, PowerSGD, top-k), so every rank skips.
"""

from __future__ import annotations

import pytest
import torch

SHAPES = ([(32, 16), (16,), (24, 4, 4), (3, 5), (32, 16), (7,)],   # (3, 5) and vectors: not compressed
          [(20, 20), (20,)])                                           # bucket 1, the last
PAD = 8          # ours is a padded flat buffer, as a strategy's; torch's bucket is exactly numel


def _offsets(shapes) -> list[int]:
    out = [0]
    for s in shapes:
        out.append(out[-1] + torch.Size(s).numel())
    return out


def _grad(index: int, rank: int, step: int, salt: int = 0) -> torch.Tensor:
    """(numel,) the gradient of bucket `index` on `rank` at `step`: any rank can draw any rank's."""
    n = _offsets(SHAPES[index])[-1]
    return torch.randn(n, generator=torch.Generator().manual_seed(((salt * 8 + rank) * 8 + step) * 2 + index))


class TorchBucket:
    """The parts of `dist.GradBucket` torch's hooks call."""

    def __init__(self, index: int, flat: torch.Tensor, last: bool) -> None:
        self._index, self._buf, self._last = index, flat, last
        self._offsets, self._shapes = _offsets(SHAPES[index]), [torch.Size(s) for s in SHAPES[index]]

    def buffer(self) -> torch.Tensor:
        return self._buf

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last

    def gradients(self) -> list[torch.Tensor]:
        o = self._offsets
        return [self._buf[lo:hi].view(s) for lo, hi, s in zip(o, o[1:], self._shapes)]


def _ours(index: int, flat: torch.Tensor):
    from ringzero.parallel.compression.bucket import GradBucket
    n = flat.numel()
    buf = torch.cat([flat, flat.new_zeros((-n) % PAD)])
    return GradBucket(index, buf, _offsets(SHAPES[index]), [torch.Size(s) for s in SHAPES[index]])


def _link(group, algo: str):
    import torch.distributed as dist
    from ringzero.parallel.compression.bucket import Link
    return Link(group, dist.get_world_size(group), lambda c: algo)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# ---- fp16 / bf16 ---------------------------------------------------------------------------

def _cast_case(group, kind: str, algo: str):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from ringzero.parallel.compression import Cast16
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    g = _grad(0, rank, 0) * 30.0                      # magnitudes up to ~100: several 16-bit exponents
    theirs = getattr(default_hooks, f"{kind}_compress_hook")(group, TorchBucket(0, g.clone(), True)).wait()
    b = _ours(0, g.clone())
    Cast16(kind).reduce(b, _link(group, algo))
    return b.buffer[:b.numel] / world, theirs.clone()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["fp16", "bf16"])
@pytest.mark.parametrize("algo", ["torch", "ring"])
def test_cast16_sum_over_ranks_is_torchs_mean(pool, world, kind, algo):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[kind]
    # Both cast the fp32 bucket, divide it by the ranks in 16 bits, and sum the same 16-bit values.
    terms = torch.stack([(_grad(0, r, 0) * 30.0).to(dtype).div_(world).float() for r in range(world)])
    eps = torch.finfo(dtype).eps
    for ours, theirs in pool.run(_cast_case, kind, algo, world=world):
        if algo == "torch":
            # The same gloo all-reduce on the same 16-bit inputs gives the same 16-bit sum; cast to
            # fp32, ours multiplies it by the ranks and the test divides again: exact for 2 and 4.
            assert torch.equal(ours, theirs)
        else:
            # The ring adds the ranks' chunks in another order: each of the world - 1 additions
            # rounds by at most half an ulp of the partial sum, in either order.
            bound = (world - 1) * eps * terms.abs().sum(0) + torch.finfo(dtype).tiny
            assert bool(((ours - theirs).abs() <= bound).all()), float(((ours - theirs).abs() / bound).max())


# ---- PowerSGD ------------------------------------------------------------------------------

def _powersgd_case(group, R: int, seed: int):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    from ringzero.parallel.compression import PowerSGD, Starting
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    # process_group is the pool's prefix group: None would mean all 8 pool ranks (WORLD).
    state = ps.PowerSGDState(process_group=group, matrix_approximation_rank=R, start_powerSGD_iter=2,
                             min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=seed)
    hook, link = Starting(PowerSGD(R, seed=seed), 2), _link(group, "torch")
    worst = {"P": 0.0, "Q": 0.0, "residual": 0.0, "output": 0.0, "plain output": 0.0}
    compressed = 0
    for step in range(5):
        for idx in range(len(SHAPES)):
            g = _grad(idx, rank, step, salt=seed)
            # torch counts a step when the last bucket is reduced (`maybe_increase_iter`).
            theirs = ps.powerSGD_hook(state, TorchBucket(idx, g.clone(), idx == len(SHAPES) - 1)).wait()
            b = _ours(idx, g.clone())
            if hook.active:
                hook.reduce(b, link)
            else:                                   # the strategy's own plain sum before the start
                link.all_reduce(b.buffer)
            out = _rel(b.buffer[:b.numel] / world, theirs)
            if not hook.active:
                worst["plain output"] = max(worst["plain output"], out)
                continue
            compressed += 1
            inner = hook.inner
            worst["output"] = max(worst["output"], out)
            worst["P"] = max(worst["P"], _rel(inner.last_p, state.p_memory_dict[idx]))
            worst["Q"] = max(worst["Q"], _rel(inner.qs.staged[idx], state.q_memory_dict[idx]))
            worst["residual"] = max(worst["residual"], _rel(inner.residuals.staged[idx], state.error_dict[idx]))
        hook.settle(False)
        if step >= 2:                               # what a compressed step kept is torch's state
            for idx in range(len(SHAPES)):
                worst["Q"] = max(worst["Q"], _rel(hook.inner.qs.kept[idx], state.q_memory_dict[idx]))
                worst["residual"] = max(worst["residual"],
                                        _rel(hook.inner.residuals.kept[idx], state.error_dict[idx]))
    return compressed, worst


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("R", [1, 2, 4])
def test_powersgd_matches_torchs_hook_step_by_step(pool, world, R):
    for compressed, worst in pool.run(_powersgd_case, R, 7 + R, world=world):
        assert compressed == 3 * len(SHAPES)        # steps 2, 3, 4; steps 0 and 1 plain
        assert all(v < 1e-5 for v in worst.values()), worst


# ---- top-k ---------------------------------------------------------------------------------

def _topk_case(group, fraction: float, algo: str, steps: int = 3):
    import torch.distributed as dist
    from ringzero.parallel.compression import TopK
    from ringzero.plan.strategies.compression import topk_k
    rank = dist.get_rank(group)
    hook, link = TopK(fraction), _link(group, algo)
    out = []
    for step in range(steps):
        g = _grad(0, rank, step)
        old = hook.residuals.get(0)
        x_in = g + old if old is not None else g.clone()
        b = _ours(0, g.clone())
        hook.reduce(b, link)
        new = hook.residuals.staged[0]
        hook.settle(False)
        # The k largest |g + e| (drawn from randn: no ties) are sent, the rest carried over.
        k = topk_k(x_in.numel(), fraction)
        mask = x_in.abs() >= x_in.abs().kthvalue(x_in.numel() - k + 1).values
        kept = torch.where(mask, x_in, torch.zeros_like(x_in))
        assert int(mask.sum()) == k
        assert torch.equal(new, torch.where(mask, torch.zeros_like(x_in), x_in)), step
        assert torch.equal(kept + new, x_in), step          # error feedback loses nothing
        out.append((g, kept, new.clone(), b.buffer[:b.numel].clone()))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("fraction", [1.0, 0.05])
@pytest.mark.parametrize("algo", ["torch", "ring"])
def test_topk_sums_every_ranks_kept_entries_exactly(pool, world, fraction, algo):
    per_rank = pool.run(_topk_case, fraction, algo, world=world)
    for step in range(len(per_rank[0])):
        expected = torch.zeros_like(per_rank[0][step][0])
        for r in range(world):                      # every rank adds the pairs in rank order
            expected = expected + per_rank[r][step][1]
        for r in range(world):
            g, kept, new, output = per_rank[r][step]
            assert torch.equal(output, expected), (step, r)
            if fraction == 1.0:                     # everything sent: the plain sum, no residual
                plain = torch.zeros_like(g)
                for q in range(world):
                    plain = plain + per_rank[q][step][0]
                assert torch.equal(output, plain) and torch.count_nonzero(new) == 0, (step, r)


# ---- a skipped step ------------------------------------------------------------------------

def _hook(scheme: str):
    from ringzero.parallel.compression import PowerSGD, TopK
    return PowerSGD(2, seed=3) if scheme == "powersgd" else TopK(0.1)


def _kept(hook) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in hook.state_dict().items()}


def _staging_case(group, scheme: str):
    import torch.distributed as dist
    link, rank = _link(group, "ring"), dist.get_rank(group)
    hook, twin = _hook(scheme), _hook(scheme)

    def step(h, s, skipped, rescale=1.0):
        b = _ours(0, _grad(0, rank, s, salt=5))
        h.reduce(b, link)
        h.settle(skipped, rescale)
        return b.buffer[:b.numel].clone()

    for s in (0, 1):
        step(hook, s, False)
        step(twin, s, False)
    before = _kept(hook)
    step(hook, 2, True)                             # overflowed: its state is dropped
    after = _kept(hook)
    same = before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    unseen = torch.equal(step(hook, 3, False), step(twin, 3, False))     # as if step 2 never ran
    before = _kept(hook)
    step(hook, 4, True, rescale=0.5)                # the scale halves: residuals follow, Q is scale-free
    after = _kept(hook)
    halved = all(torch.equal(after[k], before[k] * (0.5 if k.startswith("residual") else 1.0)) for k in before)
    staged = sum(len(getattr(hook, n).staged) for n in ("residuals", "qs") if hasattr(hook, n))
    return same, unseen, halved, staged, sorted(before)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scheme", ["powersgd", "topk"])
def test_a_skipped_step_leaves_residuals_and_q_as_they_were(pool, scheme):
    for same, unseen, halved, staged, keys in pool.run(_staging_case, scheme, world=2):
        assert keys == (["q.0", "residual.0"] if scheme == "powersgd" else ["residual.0"])
        assert same and unseen and halved and staged == 0, (same, unseen, halved, staged)


# ---- overflow ------------------------------------------------------------------------------

def _inf_case(group, scheme: str, at: int):
    import torch.distributed as dist
    from ringzero.parallel.compression import Cast16
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    hook, link = (Cast16("fp16") if scheme == "fp16" else _hook(scheme)), _link(group, "ring")
    clean = _ours(0, _grad(0, rank, 0))
    hook.reduce(clean, link)
    hook.settle(False)
    g = _grad(0, rank, 1)
    if rank == world - 1:
        g[at] = float("inf")
    b = _ours(0, g)
    hook.reduce(b, link)
    reached = not bool(torch.isfinite(b.buffer[:b.numel]).all())
    hook.settle(True)                               # the loss scaler skips the step
    return reached, all(bool(torch.isfinite(t).all()) for t in hook.state_dict().values())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("scheme, at", [("fp16", 100), ("powersgd", 100), ("powersgd", 515),
                                        ("powersgd", 915), ("topk", 100)])
def test_an_inf_on_one_rank_reaches_every_rank(pool, world, scheme, at):
    """`at`: in the first (32, 16) matrix (compressed), in the (16,) vector and in the (3, 5)
    matrix (both in PowerSGD's plain all-reduce)."""
    for reached, state_finite in pool.run(_inf_case, scheme, at, world=world):
        assert reached and state_finite
