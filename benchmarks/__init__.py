"""Benchmarks: each one command writing a JSON result under benchmarks/results/."""
