#!/usr/bin/env python3
"""Build the tiny random-weights Llama that otel_rollout's engine tests run on.

No model hub is reachable from the machines this project is built on, so tests use a model
built locally in a few seconds:

* ``LlamaConfig``: hidden 128, intermediate 256, 2 layers, 4 heads, 4 KV heads, head_dim 32
  (vLLM's CPU attention needs head_dim 32..512), vocab 1024, max_position_embeddings 4096,
  weights random (fixed seed) and saved as bfloat16 safetensors.
* tokenizer: a ByteLevel BPE (vocab 1024) trained with ``tokenizers`` on a fixed, sorted set of
  the running Python's stdlib ``.py`` files, wrapped in ``PreTrainedTokenizerFast`` with
  ``<s>``/``</s>``/``<pad>``/``<unk>`` and a minimal chat template (so ``LLM.chat`` works).

The output is plain Hugging Face format, built once and loaded by both the vLLM environment
(its transformers) and the SGLang environment (transformers 5.x).

Usage::

    python scripts/make_tiny_model.py [OUT_DIR] [--force]

OUT_DIR defaults to ``${OTEL_ROLLOUT_CACHE:-~/.cache/otel-rollout}/models/tiny-llama-v1``.
When OUT_DIR already holds a complete model (marker file), nothing is rebuilt. The model's
path is the only thing printed on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

MODEL_VERSION = "tiny-llama-v1"
MARKER = ".tiny-model-complete"
SEED = 1234
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3
CORPUS_MAX_BYTES = 4 * 1024 * 1024

# Minimal chat template: "<s><|user|>\nHi</s>\n<|assistant|>\n"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    hidden_act="silu",
    tie_word_embeddings=False,
    initializer_range=0.02,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=3,
)


def default_out_dir() -> Path:
    root = os.environ.get("OTEL_ROLLOUT_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "otel-rollout"
    )
    return Path(root) / "models" / MODEL_VERSION


def log(msg: str) -> None:
    print(f"[make_tiny_model] {msg}", file=sys.stderr, flush=True)


def corpus_files() -> list[Path]:
    """A fixed, sorted list of top-level stdlib modules, capped in size."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for p in sorted(stdlib.glob("*.py")):
        size = p.stat().st_size
        if total + size > CORPUS_MAX_BYTES:
            break
        files.append(p)
        total += size
    if not files:
        raise SystemExit(f"no .py files found in stdlib dir {stdlib} to train the tokenizer on")
    return files


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = [str(p) for p in corpus_files()]
    tok.train(files, trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A",
        pair="<s> $A <s> $B",
        special_tokens=[("<s>", bos_id)],
    )
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))

    # Normalise across transformers versions: keep the chat template in BOTH places that
    # transformers 4.x (tokenizer_config.json) and 5.x (chat_template.jinja) read it from,
    # and name a tokenizer class that both know.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["bos_token"], cfg["eos_token"] = "<s>", "</s>"
    cfg["pad_token"], cfg["unk_token"] = "<pad>", "<unk>"
    cfg["add_bos_token"] = False  # the post-processor above already adds <s>
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def build_model(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(**CONFIG)
    model = LlamaForCausalLM(config)
    model.to(torch.bfloat16)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=CONFIG["bos_token_id"],
        eos_token_id=CONFIG["eos_token_id"],
        pad_token_id=CONFIG["pad_token_id"],
    )
    model.save_pretrained(str(out), safe_serialization=True)

    # Normalise config.json across transformers versions (4.x writes torch_dtype, 5.x dtype).
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "bfloat16"
    cfg["dtype"] = "bfloat16"
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["model_type"] = "llama"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def verify(out: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("def hello(): return 1")["input_ids"]
    assert ids[0] == CONFIG["bos_token_id"], ids
    assert max(ids) < VOCAB_SIZE, ids
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|assistant|>\n"), chat
    cfg = AutoConfig.from_pretrained(str(out))
    assert cfg.model_type == "llama" and cfg.head_dim == 32, cfg


def is_complete(out: Path) -> bool:
    m = out / MARKER
    return m.is_file() and m.read_text().strip().startswith(MODEL_VERSION)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?", type=Path, default=None)
    ap.add_argument("--force", action="store_true", help="rebuild even when complete")
    args = ap.parse_args(argv)
    out: Path = (args.out_dir or default_out_dir()).expanduser().resolve()

    if is_complete(out) and not args.force:
        log(f"reusing {out}")
        print(out)
        return 0

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=str(out.parent)))
    try:
        log(f"building {MODEL_VERSION} in {out}")
        build_tokenizer(tmp)
        build_model(tmp)
        verify(tmp)
        import transformers

        (tmp / MARKER).write_text(
            f"{MODEL_VERSION} seed={SEED} built-with transformers=={transformers.__version__}\n"
        )
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"done: {out}")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
