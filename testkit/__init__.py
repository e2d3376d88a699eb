"""Shared helpers for otel_rollout's tests, benchmarks and scripts (not part of the package).

``engines``: the real engines' fastest CPU settings and long-tail workloads; ``otlp_receiver``: a
real OTLP (gRPC + HTTP) receiver; ``sgl_kernel_standin``: the test-environment stand-in for the
missing CPU ``sgl_kernel`` binary (FACTS.md). Tests, ``benchmarks/`` and ``scripts/`` import them
from here, so none of them reaches into another's folder.
"""
