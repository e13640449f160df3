"""medray: fine-tune, serve and evaluate LLMs on medical QA benchmarks, on Ray."""

__version__ = "0.1.0"
