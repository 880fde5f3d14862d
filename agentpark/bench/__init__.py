"""Benchmarks run by ``agentpark bench``: each prints ratios measured within one run."""
