"""Tests of the IR layer: dtypes, the graph, its text form, the verifier, weights."""
