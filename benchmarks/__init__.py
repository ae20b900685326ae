"""Benchmarks: each one command writing a JSON result under benchmarks/results/."""

import agrame  # noqa: F401,E402 (first, before any benchmark imports torch: agrame sets OpenMP's wait policy)
