import torch

from fuselens import kernel_timing


def fn(x):
    return (x * 2).exp() + 1


if __name__ == "__main__":
    # three timed calls of one graph of the fuselens backend; then how many kernel timers
    # the run collects from (tests/test_kernel_timing.py runs this twice in one worker)
    compiled = torch.compile(fn, backend="fuselens")
    for _ in range(3):
        compiled(torch.randn(64))
    print("timers", len(kernel_timing.live_timers()))
