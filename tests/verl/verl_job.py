"""verl's own agent-loop rollout, run the way a user runs it in standalone rollout mode.

Nothing here knows about OpenTelemetry: the test starts this file under ``opentelemetry-instrument``
and observes from the outside, so what it proves is zero-code. The job builds verl 0.9.1's
default trainer config (``verl/trainer/config/ppo_trainer.yaml``, composed with Hydra), starts the
rollout servers with ``LLMServerManager.create(config, worker_group=None)`` (no trainer workers),
builds an ``AgentLoopManager`` on them and calls ``generate_sequences`` once per step with
``meta_info["global_steps"]`` set, exactly as ``RayPPOTrainer.fit`` does.

Long tail without touching verl: verl gives every sample the same sampling parameters, but its
vLLM server caps ``max_tokens`` at ``max_model_len - len(prompt)``. With ``ignore_eos`` and a
``max_model_len`` below ``prompt_length + response_length``, a sample's response length is
``min(response_length, max_model_len - prompt_tokens)``: long prompts get short answers, the few
short prompts run to the full ``response_length``.

Prints one JSON object on stdout (and writes it to ``--out`` if given): start-up time, and per
step the wall time, the prompt and response length of every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

RESPONSE_LENGTH = 64
PROMPT_LENGTH = 192
MAX_MODEL_LEN = 200  # < PROMPT_LENGTH + RESPONSE_LENGTH: the prompt length sets the response length


def compose_config(model: str, num_workers: int) -> Any:
    """verl's own default config files, with the overrides a CPU standalone rollout needs."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    rollout = "actor_rollout_ref.rollout"
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        f"{rollout}.name=vllm",
        f"{rollout}.mode=async",
        f"{rollout}.nnodes=1",
        f"{rollout}.n_gpus_per_node=1",
        f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.load_format=auto",  # the default (dummy) expects weights pushed by a trainer
        f"+{rollout}.enable_sleep_mode=False",  # sleep mode needs CUDA (a dataclass field, not in the yaml)
        f"{rollout}.free_cache_engine=False",
        f"{rollout}.enforce_eager=True",  # CPU: no graph compilation at start
        f"{rollout}.agent.num_workers={num_workers}",
        f"{rollout}.prompt_length={PROMPT_LENGTH}",
        f"{rollout}.response_length={RESPONSE_LENGTH}",
        f"{rollout}.max_model_len={MAX_MODEL_LEN}",
        f"{rollout}.ignore_eos=True",
        f"{rollout}.calculate_log_probs=False",
        f"{rollout}.skip_tokenizer_init=False",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
    ]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def prompt_for(tokenizer: Any, target_tokens: int) -> list[dict[str, str]]:
    """A chat prompt whose templated form has about ``target_tokens`` tokens."""
    words = 1
    while True:
        messages = [{"role": "user", "content": " ".join(f"w{i % 97}" for i in range(words))}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        if len(ids) >= target_tokens or words > 4 * target_tokens:
            return messages
        words += max(1, (target_tokens - len(ids)) // 3)


def step_lengths(step: int, batch: int) -> list[int]:
    """Wanted response lengths of a step: most short, one or two at the full response length."""
    import random

    rng = random.Random(step)
    wanted = [min(RESPONSE_LENGTH, int(4 * rng.paretovariate(1.1))) for _ in range(batch)]
    wanted[step % batch] = RESPONSE_LENGTH
    return wanted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    import numpy as np
    import ray
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop import AgentLoopManager
    from verl.protocol import DataProto
    from verl.workers.rollout.llm_server import LLMServerManager

    t0 = time.monotonic()
    # verl places its rollout servers in a resource pool counted in Ray "GPU"s; on CPU one is
    # declared so the pool can be made (nothing uses it: vLLM's CPU platform runs the model).
    ray.init(num_gpus=1, include_dashboard=False)
    config = compose_config(args.model, args.num_workers)
    servers = LLMServerManager.create(config=config, worker_group=None)
    t_servers = time.monotonic()
    manager = AgentLoopManager.create(config=config, llm_client=servers.get_client())
    t_ready = time.monotonic()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    result: dict[str, Any] = {
        "pid": os.getpid(),
        "server_start_s": round(t_servers - t0, 3),
        "agent_workers_start_s": round(t_ready - t_servers, 3),
        "response_length": RESPONSE_LENGTH,
        "prompt_length": PROMPT_LENGTH,
        "max_model_len": MAX_MODEL_LEN,
        "steps": [],
    }
    for step in range(1, args.steps + 1):
        wanted = step_lengths(step, args.batch)
        prompts = [
            prompt_for(tokenizer, MAX_MODEL_LEN - w if w < RESPONSE_LENGTH else 16) for w in wanted
        ]
        raw = np.empty(len(prompts), dtype=object)
        raw[:] = [np.array(p, dtype=object) for p in prompts]
        batch = DataProto.from_single_dict(
            {
                "raw_prompt": raw,
                "agent_name": np.array(["single_turn_agent"] * len(prompts), dtype=object),
                # the dataset's row index, as verl's RLHFDataset gives it (``extra_info.index``):
                # verl's trajectory ids (and so ours) are built from it
                "index": np.arange(len(prompts)) + (step - 1) * len(prompts),
            },
            meta_info={"global_steps": step},
        )
        t = time.monotonic()
        out = manager.generate_sequences(batch)
        wall = time.monotonic() - t
        prompt_width = out.batch["prompts"].shape[1]
        attention = out.batch["attention_mask"]
        result["steps"].append(
            {
                "step": step,
                "samples": len(out),
                "wall_s": round(wall, 3),
                "prompt_tokens": attention[:, :prompt_width].sum(-1).tolist(),
                "response_tokens": out.batch["response_mask"].sum(-1).tolist(),
            }
        )
    result["total_s"] = round(time.monotonic() - t0, 3)
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text, flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
