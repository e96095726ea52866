"""A graph break in the middle: the value after it changes shape with the batch."""
import torch


def forward(x):
    h = torch.relu(x @ x.T)
    print("rows", h.shape[0])
    return h.softmax(-1)


if __name__ == "__main__":
    f = torch.compile(forward, backend="eager")
    for batch in (4, 6, 8):
        out = f(torch.randn(batch, 8))
    print("ok", tuple(out.shape))
