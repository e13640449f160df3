"""Hyperparameter sweeps (Ray Tune over the `medray train` TorchTrainer).

Importing this package is cheap; Ray is imported inside the functions that need it.
"""
