"""A program stuck in a loop that never ends."""
import time


def wait_forever():
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    print("waiting", flush=True)
    wait_forever()
