"""The step tests use the vLLM fixtures of tests/conftest.py (one engine per session)."""
