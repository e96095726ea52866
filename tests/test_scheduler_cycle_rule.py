"""The scheduler's cycle rule takes two shortcuts (scheduler.py, rule_no_cycle): it looks
through the other kernels only when one of them holds a step that needs a member, and it
names the step that closes a cycle from the members' descendants instead of scanning
every ancestor. Both must decide exactly as the full closure over the kernels does, with
the same words: on random graphs cut into random kernels (cycles that only another
kernel closes among them), and on every check the real graphs of a training step make."""

from __future__ import annotations

import random
from typing import Any, Optional

import pytest
import torch
import torch.nn as nn

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)
from compiled_helpers import fresh_dynamo  # noqa: F401  (autouse fixture)
from fuselens.compiler import scheduler as S
from fuselens.compiler.kernel_group import KernelGroup
from models import GPT2Block, seeded


def _direct(self: S.Scheduler, g: Any, new: Any) -> bool:
    """Whether a member needs another through single steps alone, outside the members."""
    _, mmask, reach = self.needs(g, new)
    return bool(reach & mmask)


def _full_closure(self: S.Scheduler, g: Any, new: Any) -> Optional[S.Refusal]:
    """The rule without shortcuts: every kernel that shares a step with what the members
    need runs whole before them, until nothing grows; the step named is the first one
    in graph order whose ancestors include a member."""
    _, mmask, reach = self.needs(g, new)
    merging = {id(g)} | {id(self.group_of[n.name]) for n in new if n.name in self.group_of}
    others = [v for k, v in self._unit_masks.items() if k not in merging]
    grown = True
    while grown and not reach & mmask:
        grown = False
        for gmask, gall in others:
            if reach & gmask and gall & ~reach:
                reach |= gall
                grown = True
    if not reach & mmask:
        return None
    through = next((i for i in range(len(self.steps)) if reach >> i & 1 and not mmask >> i & 1
                    and self.anc[i] & mmask), None)
    where = S.label(self.steps[through]) if through is not None else "another kernel"
    return S.Refusal("cycle", f"fusing would create a cycle through {where}, which needs one of these results "
                     "and produces (or runs in one kernel with) an input of another")


class _Step:
    def __init__(self, i: int) -> None:
        self.name = f"s{i}"

    def __str__(self) -> str:
        return self.name


def _random_state(rng: random.Random, n: int) -> tuple[S.Scheduler, list[KernelGroup], list[_Step]]:
    """A scheduler's state partway through: `n` steps in graph order, each reading a few
    earlier ones, some of them in kernels of up to four steps taken anywhere in the graph."""
    sched = object.__new__(S.Scheduler)
    sched.steps = [_Step(i) for i in range(n)]
    sched.index = {s.name: i for i, s in enumerate(sched.steps)}
    sched.deps = [{j for j in range(i) if rng.random() < 1.5 / (i + 1)} for i in range(n)]
    users: list[list[int]] = [[] for _ in range(n)]
    for i, d in enumerate(sched.deps):
        for j in d:
            users[j].append(i)
    sched.anc, sched.desc = S.transitive_edges(sched.deps, users)
    sched.group_of, sched._unit_masks, sched._grouped = {}, {}, 0
    free = list(range(n))
    rng.shuffle(free)
    groups = []
    while len(free) > n // 3:
        k = rng.randint(1, 4)
        take, free = free[:k], free[k:]
        g = KernelGroup([sched.steps[i] for i in sorted(take)], [])
        for s in g.nodes:
            sched.group_of[s.name] = g
        sched._track(g)
        groups.append(g)
    return sched, groups, [sched.steps[i] for i in free if sched.steps[i].name not in sched.group_of]


def test_on_random_graphs_and_kernels_the_cycle_rule_is_the_full_closure() -> None:
    rng = random.Random(0)
    outcomes = {"through another kernel": 0, "direct": 0, "none": 0}
    for _ in range(300):
        sched, groups, loose = _random_state(rng, rng.randint(8, 40))
        for _ in range(10):
            g = rng.choice(groups)
            new = [rng.choice(loose)] if loose and rng.random() < 0.5 else rng.choice(groups).nodes
            if any(n in g.nodes for n in new):
                continue
            got = S.Scheduler.rule_no_cycle(sched, g, new)
            assert got == _full_closure(sched, g, new)
            outcomes["none" if got is None else "direct" if _direct(sched, g, new) else "through another kernel"] += 1
    assert min(outcomes.values()) > 20, outcomes


class _DenseBlock(nn.Module):
    """DenseNet's pattern: each layer reads the concatenation of every feature before it."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.BatchNorm2d(4 + 4 * i), nn.ReLU(), nn.Conv2d(4 + 4 * i, 4, 3, padding=1))
                                    for i in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [x]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return torch.cat(feats, 1)


@pytest.mark.parametrize("make, shape", [(_DenseBlock, (2, 4, 8, 8)), (lambda: GPT2Block(32, 4), (2, 16, 32))])
def test_the_cycle_rule_decides_and_words_every_check_as_the_full_closure_does(monkeypatch, make, shape) -> None:
    fast = S.Scheduler.rule_no_cycle
    seen = {"refused": 0, "passed": 0}

    def both(self: S.Scheduler, g: Any, new: Any) -> Optional[S.Refusal]:
        got = fast(self, g, new)
        assert got == _full_closure(self, g, new)
        seen["refused" if got else "passed"] += 1
        return got

    monkeypatch.setattr(S.Scheduler, "rule_no_cycle", both)
    model = seeded(make).train()
    x = torch.randn(*shape)
    torch.compile(model, backend="fuselens")(x).square().mean().backward()
    assert seen["passed"] and seen["refused"], seen  # both outcomes checked
