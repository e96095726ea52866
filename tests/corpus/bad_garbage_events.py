# Writes malformed lines into fuselens's event pipe (found from the worker's
# command line) to prove a confused stream never crashes the parent.
import os

import torch

args = open("/proc/self/cmdline", "rb").read().split(b"\0")
fd = int(args[args.index(b"--events-fd") + 1])
os.write(fd, b"not json at all\n{\"type\": \"Nope\", \"data\": {}}\n{\"type\": \"GraphBreak\", \"data\": 5}\n")


def fn(x):
    print("still captured")
    return x + 1


torch.compile(fn, backend="eager")(torch.ones(2))
