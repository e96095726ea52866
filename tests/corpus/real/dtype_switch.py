"""The same compiled function called with float32, then float64 data."""
import torch


@torch.compile(backend="eager")
def normalize(x):
    return (x - x.mean()) / (x.std() + 1e-6)


if __name__ == "__main__":
    a = normalize(torch.randn(64))
    b = normalize(torch.randn(64, dtype=torch.float64))
    print("dtypes", a.dtype, b.dtype)
