import sys

chunk = "x" * 1023 + "\n"
for _ in range(40_000):  # ~40 MB on stdout
    sys.stdout.write(chunk)
