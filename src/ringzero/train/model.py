"""ringzero's GPT: pre-LayerNorm decoder, causal self-attention, 4h GELU MLP, learned positions,
tied embeddings (GPT-2, Radford et al. 2019; nanoGPT's layout). Its shape is a `plan.ModelShape`, so
the planner describes exactly this model.

The model knows nothing of parallelism, but it is shape-generic so that tensor parallelism
(`ringzero.parallel.tp.tensor_parallel`) can swap its modules: attention derives its head count from the
width of the fused qkv output and a fixed head_dim (a rank holding a/t heads gets (b, s, 3h/t)), and
its sequence length from that output too (under sequence parallelism a block's input holds s/t
tokens, which qkv all-gathers); the tied head and the loss are submodules (`head`, `loss`).

Two knobs matter for activation memory:
`attention="eager"` materialises the (b, a, s, s) scores, softmax and dropout mask, the case of
Korthikanti et al. 2022's 5·a·s²·b term (§4.1); `attention="sdpa"` calls torch's fused
`scaled_dot_product_attention`, which keeps no s x s tensor (the flash-attention case). The attention
core is its own module so selective recomputation can wrap exactly it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ringzero.plan.model.shapes import ModelShape
from ringzero.run.config import ATTENTIONS
from ringzero.run.gpt_shape import check_shape



def _dropout(p: float) -> nn.Module:
    # No dropout op at all when p = 0, so no mask is saved for backward.
    return nn.Dropout(p) if p > 0 else nn.Identity()


class AttentionCore(nn.Module):
    """softmax(q kᵀ / sqrt(d) + causal mask) v, with dropout on the weights.

    q, k, v: (b, a, s, d) -> (b, a, s, d). Eager attention is one `baddbmm` that scales q kᵀ and
    adds the 0/-inf causal bias in the GEMM's epilogue, then softmax, dropout and a `bmm`: one s x s
    tensor is written before softmax instead of three (scores, scaled, masked), which makes the
    forward 1.3-1.5x faster on CPU and recomputing it (selective) correspondingly cheaper.
    """

    def __init__(self, seq: int, attention: str, dropout: float) -> None:
        super().__init__()
        self.attention, self.p = attention, dropout
        self.drop = _dropout(dropout)
        bias = torch.full((seq, seq), float("-inf")).triu(1)                 # (s, s): 0 on and below the diagonal
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  dropout_p=self.p if self.training else 0.0)
        b, a, s, d = q.shape
        bias = self.bias[:s, :s].to(q.dtype)
        scores = torch.baddbmm(bias, q.reshape(b * a, s, d), k.reshape(b * a, s, d).transpose(1, 2),
                               alpha=1.0 / math.sqrt(d))                         # (b·a, s, s)
        probs = self.drop(scores.softmax(dim=-1))
        return (probs @ v.reshape(b * a, s, d)).view(b, a, s, d)


class Attention(nn.Module):
    def __init__(self, m: ModelShape, attention: str, dropout: float) -> None:
        super().__init__()
        self.head_dim = m.head_dim
        self.qkv = nn.Linear(m.hidden, 3 * m.hidden, bias=m.bias)                 # (b, s, h) -> (b, s, 3h)
        self.core = AttentionCore(m.seq, attention, dropout)
        self.proj = nn.Linear(m.hidden, m.hidden, bias=m.bias)
        self.drop = _dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)                                  # (b, s, 3·a·d): q, k, v of a heads, stacked
        b, s, width = qkv.shape
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2)              # (b, a, s, d)
                   for t in qkv.chunk(3, dim=2))
        y = self.core(q, k, v).transpose(1, 2).contiguous().view(b, s, width // 3)
        return self.drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, m: ModelShape, dropout: float) -> None:
        super().__init__()
        self.fc = nn.Linear(m.hidden, m.ffn_dim, bias=m.bias)                     # (b, s, h) -> (b, s, 4h)
        self.act = nn.GELU()
        self.proj = nn.Linear(m.ffn_dim, m.hidden, bias=m.bias)
        self.drop = _dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, m: ModelShape, attention: str, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(m.hidden, bias=m.bias)
        self.attn = Attention(m, attention, dropout)
        self.ln2 = nn.LayerNorm(m.hidden, bias=m.bias)
        self.mlp = MLP(m, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TiedHead(nn.Module):
    """Logits from the token embedding's weight: (b, s, h) @ (V, h)ᵀ -> (b, s, V)."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)


class CrossEntropy(nn.Module):
    """Mean cross-entropy of logits (b, s, V) against targets (b, s), computed in fp32."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


class GPT(nn.Module):
    """A GPT of shape `m` (which must be one this model can be: see `check_shape`)."""

    def __init__(self, m: ModelShape, *, attention: str = "eager", dropout: float = 0.0) -> None:
        super().__init__()
        check_shape(m)
        if attention not in ATTENTIONS:
            raise ValueError(f"attention={attention!r}; allowed: {', '.join(ATTENTIONS)}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.shape = m
        self.wte = nn.Embedding(m.vocab, m.hidden)
        self.wpe = nn.Embedding(m.seq, m.hidden)
        self.drop = _dropout(dropout)
        self.blocks = nn.ModuleList(Block(m, attention, dropout) for _ in range(m.layers))
        self.ln_f = nn.LayerNorm(m.hidden, bias=m.bias)
        self.head = TiedHead()
        self.loss = CrossEntropy()
        self.apply(self._init)
        for name, p in self.named_parameters():          # GPT-2: scale residual projections by 1/sqrt(2L)
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * m.layers))

    @staticmethod
    def _init(mod: nn.Module) -> None:
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            nn.init.normal_(mod.weight, mean=0.0, std=0.02)
        if isinstance(mod, nn.Linear) and mod.bias is not None:
            nn.init.zeros_(mod.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (b, s) -> logits (b, s, V), or the mean cross-entropy when `targets` is given."""
        s = idx.size(1)
        if s > self.shape.seq:
            raise ValueError(f"sequence of {s} tokens is longer than the model's {self.shape.seq}")
        pos = torch.arange(s, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))                              # (b, s, h)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x), self.wte.weight)                        # tied: (b, s, V)
        return logits if targets is None else self.loss(logits, targets)
