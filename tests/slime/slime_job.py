"""slime's driver loop (``train.py`` of slime 0.3.1), run under ``opentelemetry-instrument`` by
tests/slime/test_slime_rollout.py, with no otel_rollout code in it.

As slime's driver does: one ``RolloutManager`` Ray actor; ``eval.remote(rollout_id=0)`` before
training, then ``generate.remote(rollout_id)`` once per step, each waited for with ``ray.get``.
The actor is the TEST STAND-IN of tests/slime/standin (slime is not on PyPI); everything it talks
to is real: Ray, sglang-router, the SGLang server behind it.

Writes what slime saw to argv[2] (JSON): per call, the rollout id, whether it was the
evaluation, and SGLang's ``meta_info`` id of each sample, so the test can compare.
"""

from __future__ import annotations

import json
import sys

import ray
from slime.ray.rollout import RolloutManager

# Token ids of four short prompts, as slime sends them (the tiny Llama's vocabulary is 1,024).
PROMPTS = [[1, 450, 496, 173], [1, 903, 250, 263], [1, 150, 298, 590], [1, 724, 338]]
LENGTHS = [4, 6, 3, 24, 5, 4]  # one sample of the step runs long: the step's tail


def main() -> None:
    router_url, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ray.init(num_cpus=2, include_dashboard=False)
    manager = RolloutManager.options(num_cpus=0).remote(router_url, PROMPTS, LENGTHS)
    calls = []

    def record(result: dict, evaluation: bool) -> None:
        ids = [meta["id"] for meta in result["samples"]]
        calls.append({"rollout_id": result["rollout_id"], "eval": evaluation, "ids": ids})

    record(ray.get(manager.eval.remote(rollout_id=0)), True)
    for rollout_id in range(steps):
        record(ray.get(manager.generate.remote(rollout_id)), False)
    ray.shutdown()
    with open(out, "w") as f:
        json.dump({"calls": calls}, f)


if __name__ == "__main__":
    main()
