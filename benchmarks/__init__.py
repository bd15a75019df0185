"""Benchmarks, sweeps, tuning scripts and the GPU run script (not tests; see README)."""
