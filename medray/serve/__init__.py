"""The Serve app (ingress + vLLM replicas): app.py; its parts: config (the app's config,
validated without Ray), schemas (HTTP bodies), errors (one JSON error path), limits
(checks before tokenising), validation (start-up checks of models and adapters), llm (LLM
deployments), inproc (vLLM's engine core in the replica's process), openapi (the
document), ray_internal (the one user of Ray's private APIs)."""
