"""Small models built in code (no downloads) for compiler correctness tests and
benchmarks: a GPT-2 block, a ResNet basic block and an MLP with a training step.

Sizes are small so a compile plus a few calls stay fast on 2 CPU cores; the
structure (ops, fusion opportunities, views, reductions, backward) is the real
one.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """GPT-2 attention: fused qkv projection, heads split by view/transpose,
    causal mask, softmax, output projection. `use_sdpa` picks
    `F.scaled_dot_product_attention` (an extern call for the compiler) or the
    explicit matmul-mask-softmax-matmul chain (lowered pointwise/reductions)."""

    def __init__(self, d_model: int, n_head: int, max_seq: int = 64, use_sdpa: bool = True) -> None:
        super().__init__()
        assert d_model % n_head == 0
        self.n_head = n_head
        self.use_sdpa = use_sdpa
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        mask = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, max_seq, max_seq), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        hd = c // self.n_head
        q = q.view(b, t, self.n_head, hd).transpose(1, 2)
        k = k.view(b, t, self.n_head, hd).transpose(1, 2)
        v = v.view(b, t, self.n_head, hd).transpose(1, 2)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class GPT2Block(nn.Module):
    """Pre-LayerNorm transformer block as in GPT-2, GELU (tanh) MLP, residuals."""

    def __init__(self, d_model: int = 64, n_head: int = 4, max_seq: int = 64, use_sdpa: bool = True) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, max_seq, use_sdpa)
        self.ln_2 = nn.LayerNorm(d_model)
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        h = F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.c_proj(h)


class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-bn-relu-conv3x3-bn, plus identity, relu."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + x)


class MLP(nn.Module):
    """Classifier MLP: Linear-ReLU-Linear-GELU-Linear."""

    def __init__(self, d_in: int = 32, hidden: int = 64, n_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.gelu(self.fc2(F.relu(self.fc1(x)))))


def make_train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One training step: forward, cross-entropy loss, backward, optimizer
    step. Returns the loss (detached)."""

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return train_step


def seeded(factory: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    """Build a module with deterministic parameters; BatchNorm statistics get
    non-trivial values so eval mode does real arithmetic."""
    torch.manual_seed(seed)
    module = factory()
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.5, 0.5)
    return module
