"""Kept for Ray Serve YAML files users wrote before the Serve app moved: their
`import_path: medray.serve_app:build_app` still loads it. The app is medray.serve.app."""

from medray.serve.app import QAIngress, build_app

__all__ = ["QAIngress", "build_app"]
