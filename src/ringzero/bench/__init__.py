"""Benchmarks behind `ringzero bench`."""
