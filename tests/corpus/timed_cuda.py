import sys

import torch


def fn(x):
    return (x * 2).exp().sum(-1)  # a reduction: Inductor autotunes its configs at the first call


if __name__ == "__main__":
    # three timed calls of one CUDA graph; argv: the backend, then compiler options as name=value
    backend = sys.argv[1]
    if backend == "fuselens":
        import fuselens.compiler

        fuselens.compiler.register()  # a source checkout on the GPU machine has no entry point
    options = dict(kv.split("=") for kv in sys.argv[2:])
    options = {k: v == "1" for k, v in options.items()} or None
    compiled = torch.compile(fn, backend=backend, options=options)
    x = torch.randn(512, 4096, device="cuda")
    for _ in range(3):
        compiled(x)
    torch.cuda.synchronize()
