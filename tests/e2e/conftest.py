from tests.vllm.conftest import vllm_module  # noqa: F401  (re-exported fixture)
