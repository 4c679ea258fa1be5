"""Benchmark (not a test): the course engine's tokens per second against transformers' `generate`.

Run:  .venv/bin/python tests/bench/engine_speed.py [--skip-large]
Needs the oracle extra (transformers). Two models with random weights: the `tiny`
preset and Qwen3-0.6B's shape (28 layers, hidden 1024, vocab 151936; about 2.4 GB
in float32 for each of the two copies; --skip-large leaves it out). Both sides decode
the same prompts greedily in float32 on the CPU, each after a short warm-up run:
the engine with the reference chapter functions and default settings (one prefill
step, then one decode step per token for the whole batch), transformers with its
default attention (SDPA) and KV cache, the prompts batched without padding (they
have equal lengths). tokens/s = generated tokens / wall time of the whole run. Prints
a Markdown table with the ratio engine / transformers and whether the tokens agree.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import engine  # noqa: E402
from engine.model import PRESETS, Model, random_model  # noqa: E402

CASES = (("tiny", 8, 32, 64), ("qwen3-0.6b-shape", 4, 32, 32))
"""(preset, requests, prompt tokens, generated tokens per request)."""


def inputs(name: str, requests: int, prompt_len: int) -> tuple[Model, list[list[int]]]:
    """A case's model (the preset `name`, random weights from seed 0) and its prompts: `requests` prompts of
    `prompt_len` token ids each, drawn uniformly from the vocabulary (seed 1)."""
    model = random_model(PRESETS[name], seed=0)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, model.config.vocab_size, (requests, prompt_len), generator=g).tolist()
    return model, prompts


def hf_twin(model: Model):
    """transformers' Qwen3ForCausalLM holding the same weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf = Qwen3ForCausalLM(Qwen3Config(**model.config.to_hf())).eval()
    missing, unexpected = hf.load_state_dict(model.hf_state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return hf


def time_engine(model: Model, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    run = lambda n: engine.Engine(model, engine.reference_parts()).generate(prompts, n)
    run(2)
    start = time.perf_counter()
    outputs = run(max_tokens).outputs
    return time.perf_counter() - start, outputs


@torch.inference_mode()
def time_transformers(hf, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts)
    gen = lambda n: hf.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
    )
    gen(2)
    start = time.perf_counter()
    out = gen(max_tokens)
    return time.perf_counter() - start, out[:, ids.shape[1] :].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-large", action="store_true", help="only the tiny model")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, greedy\n")
    print("| model | parameters | requests × prompt → new | engine tok/s | transformers tok/s | ratio | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for name, requests, prompt_len, new in CASES[:1] if args.skip_large else CASES:
        model, prompts = inputs(name, requests, prompt_len)
        engine_s, engine_out = time_engine(model, prompts, new)
        hf = hf_twin(model)
        hf_s, hf_out = time_transformers(hf, prompts, new)
        del hf
        tokens = requests * new
        ratio = (tokens / engine_s) / (tokens / hf_s)
        print(
            f"| {name} | {model.config.num_parameters / 1e6:.1f} M | {requests} × {prompt_len} → {new} | "
            f"{tokens / engine_s:.1f} | {tokens / hf_s:.1f} | {ratio:.2f} | "
            f"{'yes' if engine_out == hf_out else 'no'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
