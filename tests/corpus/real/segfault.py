"""A program that crashes the interpreter (a native extension bug)."""
import ctypes


def crash():
    ctypes.string_at(0)


if __name__ == "__main__":
    print("about to crash", flush=True)
    crash()
