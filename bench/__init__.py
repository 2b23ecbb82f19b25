"""Benchmarks: scripts that print costs as ratios against a baseline measured in the same run."""
