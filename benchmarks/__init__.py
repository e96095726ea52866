"""Benchmarks and validation scripts of fuselens (not installed with the package).

Run from the repository root: `python -m benchmarks.cpu`, `python -m benchmarks.opinfo`.
"""
