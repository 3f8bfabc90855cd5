"""Small helpers for tests, demos and benchmarks (no downloads, no GPU)."""
