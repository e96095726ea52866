"""A bytes key (e.g. a hash or a packed header) passed into compiled code."""
import torch


@torch.compile(backend="eager")
def encode(x, header):
    y = x.sin()
    print("header bytes:", len(header))
    return y + len(header)


if __name__ == "__main__":
    for i in range(3):
        header = bytes(range(256)) * 8 + bytes([i])
        out = encode(torch.randn(16), header)
    print("done", tuple(out.shape))
