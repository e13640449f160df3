"""Evaluation: metrics (generative + multiple choice), baselines, scoring with CIs."""
