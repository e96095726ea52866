import sys

chunk = "x" * 1023 + "\n"
for _ in range(8 * 1024):  # 8 MiB on stdout and on stderr
    sys.stdout.write(chunk)
    sys.stderr.write(chunk)
print("END-OF-OUTPUT")
