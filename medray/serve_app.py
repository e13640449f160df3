"""Import path of the Serve app (`import_path: medray.serve_app:build_app`); the code is in
medray/serving/."""

from medray.serving.app import QAIngress, build_app

__all__ = ["QAIngress", "build_app"]
