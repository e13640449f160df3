"""The Serve app (ingress + vLLM replicas): app.py; its parts: schemas (HTTP bodies),
errors (one JSON error path), limits (checks before tokenising), validation (start-up
checks of models and adapters), llm (LLM deployments), openapi (the document)."""
