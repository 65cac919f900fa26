"""Executors: the NumPy reference interpreter and the torch executor."""
