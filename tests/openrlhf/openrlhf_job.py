"""OpenRLHF's own rollout on CPU: its ``RolloutRayActor`` (real vLLM ``AsyncLLMEngine`` in a Ray
actor) driven by its ``SamplesGenerator``, as ``PPOTrainer.fit`` drives it. The job the OpenRLHF
tests run, bare or under ``opentelemetry-instrument``; nothing of OpenTelemetry here.

    python tests/openrlhf/openrlhf_job.py MODEL OUT_JSON [STEPS]

OpenRLHF's rollout code is untouched. TEST-ENVIRONMENT STAND-INS, named as such:

* ``fit`` below stands in for ``PPOTrainer.fit``'s loop: the same call
  (``samples_generator.generate_samples(**generate_kwargs)``) with the same local
  ``global_step``, bumped once the samples are trained on; the training itself (DeepSpeed
  actor and critic, CUDA) is not run. ``evaluate`` stands in for ``PPOTrainer.evaluate(
  global_step)`` the same way.
* ``strategy`` carries only the ``args`` the samples generator reads (OpenRLHF's
  ``DeepspeedStrategy`` needs CUDA).
* the rollout actor is made as ``create_vllm_engines`` makes it, less the GPU placement group;
  float32 (see testkit/engines.py).

Writes OUT_JSON: per step, the step number ``fit`` held and how many samples came back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

N_SAMPLES = 2
PROMPTS_PER_STEP = 4


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

    import ray
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor
    from transformers import AutoTokenizer

    from testkit.engines import VLLM_ENV, VLLM_KWARGS

    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": dict(VLLM_ENV)})
    engine = RolloutRayActor.options(num_cpus=1).remote(
        model=model, num_gpus=0, seed=0, **{**VLLM_KWARGS, "max_model_len": 512}
    )
    args = SimpleNamespace(
        rollout=SimpleNamespace(
            batch_size=PROMPTS_PER_STEP,
            n_samples_per_prompt=N_SAMPLES,
            vllm_generate_batch_size=None,
        ),
        vllm=SimpleNamespace(enable_sleep=False),
        algo=SimpleNamespace(
            dynamic_filtering_enable=False,
            # OpenRLHF's --advantage_estimator lands here (args.algo.advantage.estimator)
            advantage=SimpleNamespace(is_correction_level="off", estimator="group_norm"),
        ),
    )
    strategy = SimpleNamespace(args=args)  # TEST-ENVIRONMENT STAND-IN (see the docstring)
    prompts = [f"Question {i}: what comes after {i}?" for i in range(PROMPTS_PER_STEP * steps)]
    batches = [
        (None, prompts[i : i + 2], [str(i + 1), str(i + 2)], [None, None])
        for i in range(0, len(prompts), 2)
    ]
    evals = [(None, ["Held out: name a colour."], ["red"], [None])]
    tokenizer = AutoTokenizer.from_pretrained(model)
    generator = SamplesGenerator(strategy, batches, evals, tokenizer, [engine])
    generate_kwargs = dict(max_new_tokens=8, temperature=1.0, max_len=512)
    record: list[dict[str, object]] = []

    def fit(global_step: int = 0) -> None:
        """TEST-ENVIRONMENT STAND-IN for ``PPOTrainer.fit``'s loop (see the docstring)."""
        for _ in range(steps):
            rollout_samples, _, _, _ = generator.generate_samples(**generate_kwargs)
            record.append({"global_step": global_step, "samples": len(rollout_samples)})
            global_step += 1  # train_step(rollout_samples, global_step) returns global_step + 1
        evaluate(global_step)

    def evaluate(global_step: int) -> None:
        """TEST-ENVIRONMENT STAND-IN for ``PPOTrainer.evaluate(global_step)``."""
        samples = generator.generate_eval_samples(**generate_kwargs)
        record.append({"global_step": global_step, "samples": len(samples), "eval": True})

    fit()
    out.write_text(json.dumps({"steps": record}))
    ray.shutdown()


if __name__ == "__main__":
    main()
