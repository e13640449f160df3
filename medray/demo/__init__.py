"""`medray demo`: synthetic data -> a small model (the tiny one pre-trained here, or
SmolLM2) -> Ray Train LoRA -> Ray Serve + vLLM -> evaluation actors -> report, in one
command (see run.py for the stages)."""

from medray.demo.config import DEFAULT_DEMO_CONFIG, DEMO_CONFIGS, DemoConfig, load_demo_config
from medray.demo.run import run_demo
from medray.demo.systems import model_dirs

__all__ = ["DEFAULT_DEMO_CONFIG", "DEMO_CONFIGS", "DemoConfig", "load_demo_config", "model_dirs",
           "run_demo"]
