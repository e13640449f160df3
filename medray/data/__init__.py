"""Benchmark loaders, synthetic generators and the prepared-dataset format."""
