"""A compiled training step's outputs die with the step, by reference counting alone.

A tensor the runtime kept in a reference cycle lives until Python's cycle collector
happens to run, and meanwhile counts in the next step's peak: on the H200 BART
training's float32 logits (785 MB) and last hidden states were still alive when the
next step started, 345 MB above Inductor's peak (forty-first session). Here the
collector is off while the steps run, so any cycle keeps the outputs alive and the
test fails. A graph break splits the model into two compiled graphs whose outputs
cross eager code, as BART's do. C++ target in process; the Triton target in its CPU
interpreter (subprocess). The GPU's own launch path cannot run here.
"""

from __future__ import annotations

import gc
import weakref

import torch
import torch.nn as nn
from triton_worker import interpreted_worker_records, worker_main

import fuselens.compiler  # noqa: F401  (backend="fuselens" itself comes from the entry point)


class _TwoGraphs(nn.Module):
    """An encoder, a graph break, a head returning logits next to the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 50)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        h = self.norm(torch.relu(self.enc(x)))
        torch._dynamo.graph_break()
        logits = self.head(h).float()
        loss = nn.functional.cross_entropy(logits.view(-1, 50), labels.view(-1))
        return {"loss": loss, "logits": logits, "hidden": h}


def _outputs_alive_after_steps(options: dict) -> list[list[str]]:
    """For each of three steps, the outputs still alive once it returned."""
    torch.manual_seed(0)
    model = _TwoGraphs()
    compiled = torch.compile(model, backend="fuselens", options=options)
    x, labels = torch.randn(4, 8, 16), torch.randint(0, 50, (4, 8))
    alive = []
    torch._dynamo.reset()
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            out = compiled(x, labels)
            out["loss"].backward()
            refs = {k: weakref.ref(v) for k, v in out.items()}
            del out
            alive.append(sorted(k for k, r in refs.items() if r() is not None))
    finally:
        if enabled:
            gc.enable()
        torch._dynamo.reset()
    return alive


def test_cpp_training_step_outputs_die_without_the_cycle_collector() -> None:
    assert _outputs_alive_after_steps({"target": "cpp"}) == [[], [], []]


def test_triton_training_step_outputs_die_without_the_cycle_collector(tmp_path) -> None:
    alive = interpreted_worker_records(__file__, tmp_path / "records.json", 600, "the Triton worker")
    assert alive == [[], [], []]


if __name__ == "__main__":
    worker_main(_outputs_alive_after_steps, "fl_outputs_released_")
