"""vLLM fixtures live in tests/conftest.py: the steps, e2e, reliability and compat suites use them too."""
