import os
import signal

print("killing myself", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
