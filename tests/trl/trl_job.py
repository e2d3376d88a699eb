"""TRL's own trainer, a few steps on CPU with real vLLM colocated: the job the TRL tests run.

    python tests/trl/trl_job.py MODEL OUT_JSON [grpo|rloo] [STEPS]
    torchrun --standalone --nproc_per_node 2 tests/trl/trl_job.py …   # OUT.rank<R>.json each

Nothing of OpenTelemetry here: the tests run it bare or under ``opentelemetry-instrument``.
TRL's code is untouched. What makes it run on this CPU machine (``../shared/FACTS.md``):

* TEST-ENVIRONMENT STAND-IN: vLLM's CPU build packs each linear layer's weight (oneDNN, or its
  small-GEMM kernel for float32) and removes the weight, so TRL's per-tensor ``load_weights``
  sync fails on its first call ("'Parameter' object has no attribute 'weight_loader'"); here
  every linear layer takes vLLM's own fallback (``torch.nn.functional.linear`` on the live
  weight), which the GPU build's behaviour matches: synced weights are the ones generating.
* a float32 copy of the tiny model's config (TRL passes vLLM no dtype; bf16 attention on this
  machine's AMX CPU dies with SIGILL in vLLM 0.32);
* ``VLLM_CPU_CI_ENV=1`` (vLLM's own CPU-CI switch: the eager backend, no inductor compile).

Trains STEPS steps, then evaluates once (one generation round in eval mode). Writes OUT_JSON:
TRL's own ``global_step`` and mode at each generation round, its own timer readings
(``profiling_context``: name, step, seconds, in the order they closed), and its log history.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def float32_model(model: str, into: Path) -> str:
    """The tiny model with its config saying float32 (weights are read and cast by the engine)."""
    target = into / "model-f32"
    shutil.copytree(model, target)
    config = json.loads((target / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "float32"
    (target / "config.json").write_text(json.dumps(config))
    return str(target)


def main() -> None:
    model, out = sys.argv[1], Path(sys.argv[2])
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: each rank writes its own
        out = out.with_name(f"{out.stem}.rank{os.environ['RANK']}{out.suffix}")
    trainer_kind = sys.argv[3] if len(sys.argv) > 3 else "grpo"
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 3

    import torch
    import vllm.model_executor.layers.utils as layer_utils

    def live_weight_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        """TEST-ENVIRONMENT STAND-IN (see the docstring): vLLM's own fallback, weight kept."""
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    layer_utils.dispatch_cpu_unquantized_gemm = live_weight_linear

    from datasets import Dataset
    from trl.extras import profiling

    timers: list[dict[str, object]] = []
    log_metrics = profiling.ProfilingContext._log_metrics

    def record(self: profiling.ProfilingContext, duration: float) -> None:
        """TRL's own reading of each timer, kept for the test to compare with (TRL logs them only
        to wandb / mlflow / trackio)."""
        timers.append({"name": self.name, "step": self.step, "s": duration})
        log_metrics(self, duration)

    profiling.ProfilingContext._log_metrics = record  # type: ignore[method-assign]

    rounds: list[dict[str, object]] = []
    work = Path(tempfile.mkdtemp(prefix="trl-job-"))
    try:
        path = float32_model(model, work)
        prompts = [f"Question {i}: what comes after {i}? Answer:" for i in range(64)]
        data = Dataset.from_dict({"prompt": prompts})
        held_out = Dataset.from_dict(
            {"prompt": [f"Held out {i}: name a colour." for i in range(4)]}
        )

        def reward_length(completions: list[str], **_: object) -> list[float]:
            """Dense and deterministic, so a group's samples get different advantages."""
            return [(len(c) % 11) / 10.0 for c in completions]

        common = dict(
            output_dir=str(work / "out"),
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=4,
            per_device_eval_batch_size=4,
            num_generations=4,
            max_completion_length=16,
            max_steps=steps,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_vllm=True,
            vllm_mode="colocate",
            vllm_tensor_parallel_size=1,
            vllm_gpu_memory_utilization=0.1,
            vllm_enable_sleep_mode=False,
            dataloader_num_workers=0,
            seed=0,
        )
        if trainer_kind == "rloo":
            from trl import RLOOConfig, RLOOTrainer

            trainer = RLOOTrainer(
                model=path,
                reward_funcs=reward_length,
                args=RLOOConfig(**common),
                train_dataset=data,
                eval_dataset=held_out,
            )
        else:
            from trl import GRPOConfig, GRPOTrainer

            trainer = GRPOTrainer(
                model=path,
                reward_funcs=reward_length,
                args=GRPOConfig(**common),
                train_dataset=data,
                eval_dataset=held_out,
            )
        generate = trainer._generate_and_score_completions

        def counted(*args: object, **kwargs: object) -> object:
            rounds.append(
                {"step": trainer.state.global_step, "train": bool(trainer.model.training)}
            )
            return generate(*args, **kwargs)

        trainer._generate_and_score_completions = counted  # type: ignore[method-assign]
        trainer.train()
        trainer.evaluate()  # one round in eval mode, at the step training ended on
        out.write_text(
            json.dumps(
                {
                    "rounds": rounds,
                    "timers": timers,
                    "log_history": trainer.state.log_history,
                    "pid": os.getpid(),
                }
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
