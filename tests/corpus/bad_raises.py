import torch


def load(path):
    raise FileNotFoundError(f"no weights at {path}")


if __name__ == "__main__":
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    load("weights.pt")
