"""A small rollout job, run under ``opentelemetry-instrument`` by the exporter-trouble tests.

It generates a few batches on the real vLLM engine, prints one JSON line per batch (token ids,
seconds the generate took, RSS) and ``LAST_GENERATE_DONE <epoch>`` right after the last one,
then returns: the parent measures how long the process needs from there to exit.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def main() -> None:
    logging.basicConfig(
        level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("job").debug("debug logging is on")
    import vllm

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from testkit.engines import VLLM_KWARGS

    batches = int(os.environ.get("JOB_BATCHES", "6"))
    prompts = int(os.environ.get("JOB_PROMPTS", "16"))
    llm = vllm.LLM(model=os.environ["JOB_MODEL"], **VLLM_KWARGS)
    params = [
        vllm.SamplingParams(max_tokens=4 + i % 5, ignore_eos=True, seed=i, temperature=1.0)
        for i in range(prompts)
    ]
    for b in range(batches):
        start = time.monotonic()
        outputs = llm.generate(
            [f"{os.environ.get('JOB_PROMPT', 'job')} {b} {i}" for i in range(prompts)],
            params,
            use_tqdm=False,
        )
        took = time.monotonic() - start
        print(
            json.dumps(
                {
                    "batch": b,
                    "seconds": took,
                    "rss_mb": _rss_mb(),
                    "tokens": [list(o.outputs[0].token_ids) for o in outputs],
                }
            ),
            flush=True,
        )
    print(f"LAST_GENERATE_DONE {time.time():.6f}", flush=True)


if __name__ == "__main__":
    main()
