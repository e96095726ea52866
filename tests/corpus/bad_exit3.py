import sys

print("about to exit")
sys.exit(3)
