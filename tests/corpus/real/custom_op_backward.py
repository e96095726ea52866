"""A mixture-of-experts layer trained through a custom op whose backward reads a tensor's
value, as Hugging Face transformers' grouped-matmul fallback did up to 5.17: tracing the
backward fails in the backend, and Dynamo breaks the graph at the op."""
import torch
from torch import nn


@torch.library.custom_op("corpus::grouped_mm", mutates_args=())
def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    out = x.new_zeros(x.shape[0], w.shape[2])
    start = 0
    for i, end in enumerate(offs.tolist()):
        out[start:end] = x[start:end] @ w[i]
        start = end
    return out


@grouped_mm.register_fake
def _(x, w, offs):
    return x.new_empty(x.shape[0], w.shape[2])


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    gx, gw = torch.zeros_like(x), torch.zeros_like(w)
    start = 0
    for i, end in enumerate(ctx.offs.tolist()):
        gx[start:end] = grad[start:end] @ w[i].T
        gw[i] = x[start:end].T @ grad[start:end]
        start = end
    return gx, gw, None


grouped_mm.register_autograd(_backward, setup_context=_setup)


class Experts(nn.Module):
    def __init__(self, n: int = 4, d: int = 16, h: int = 32) -> None:
        super().__init__()
        self.router = nn.Linear(d, n)
        self.up = nn.Parameter(torch.randn(n, d, h) * 0.1)
        self.down = nn.Parameter(torch.randn(n, h, d) * 0.1)

    def forward(self, x):
        expert = self.router(x).argmax(-1)
        order = expert.argsort()
        offs = (expert[:, None] == torch.arange(self.up.shape[0])).sum(0).cumsum(0)
        h = torch.nn.functional.silu(grouped_mm(x[order], self.up, offs))
        y = torch.empty_like(x).index_copy(0, order, grouped_mm(h, self.down, offs))
        return x + y


model = Experts()
step = torch.compile(model, backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=0.01)

if __name__ == "__main__":
    for i in range(3):
        loss = step(torch.randn(64, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    print("loss", round(float(loss), 3) > 0)
