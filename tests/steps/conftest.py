"""The vLLM fixtures the step tests share with tests/vllm (one engine per session)."""

from tests.vllm.conftest import instrumented, llm, vllm_module  # noqa: F401
