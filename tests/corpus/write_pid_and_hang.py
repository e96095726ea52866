import os
import sys
import time

with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.05)
