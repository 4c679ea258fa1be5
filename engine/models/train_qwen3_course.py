"""Train `qwen3-course`, the engine's default model: a tiny Qwen3-MoE that writes the course's own English prose.

    python engine/models/train_qwen3_course.py --out DIR          # the shipped folder, again (~20 minutes, one core)
    python engine/models/train_qwen3_course.py --corpus-from REV  # rebuild the corpus from the repository at REV

The corpus is the repository's English prose: the docstrings of `solutions/`, `engine/` and `figures/` and the README
(paragraphs with Chinese characters left out), read with `git show REV:path` at one recorded commit and shipped
compressed beside this script (`qwen3-course-corpus.txt.xz`), so the corpus never changes under the script's feet and a
copy without git history trains the same model. Documents (one docstring, one README section) are separated by
`<|endoftext|>`, the model's EOS: it learns to end a passage, and to start one after it (half the training windows
start at a document; the tokenizer puts the EOS before a prompt as its BOS).

Everything is seeded (the tokenizer's training is deterministic, the data order and the weights come from SEED) and
the computation runs on one thread (OpenMP threads on a busy machine slow each other down badly, and one thread is
the most repeatable), so the same machine writes the same files; another CPU may round differently in the last bits.
Needs the `oracle` extra (transformers' Qwen3MoeForCausalLM, AdamW);
the engine itself never imports transformers. The folder it writes: config.json (float32 for computing), the
weights in bfloat16 (model.safetensors, Hugging Face's per-expert names), tokenizer.json (byte-level BPE, Hugging
Face's `tokenizers`) and training.json (seed, steps, losses, corpus hash and commit).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import lzma
import math
import re
import subprocess
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "qwen3-course-corpus.txt.xz"
DEFAULT_OUT = HERE / "qwen3-course"
EOS = "<|endoftext|>"
SEED = 20261206
SOURCES = ("solutions", "engine", "figures")
"""Folders whose Python docstrings are the corpus (with README.md); grader/ and tests/ talk about grading, not engines."""

CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 256,  # a dense layer's width; unused here (decoder_sparse_step 1, no mlp_only_layers)
    "moe_intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,  # ≠ hidden_size / num_attention_heads = 32, as in Qwen3
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "router_aux_loss_coef": 0.01,
    "output_router_logits": False,
    "initializer_range": 0.02,
    "dtype": "float32",
}
"""The model, in the names of Qwen3-30B-A3B's config.json (eos_token_id and bos_token_id are added from the tokenizer).
2.23 M parameters: 4.5 MB in bfloat16, within the package's 5 MB for the whole folder."""

SEQ_LEN, BATCH, STEPS, WARMUP, LR, MIN_LR, WEIGHT_DECAY, THREADS = 256, 16, 1600, 40, 3e-3, 3e-4, 0.1, 1

CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")
GLOSS = re.compile(r"\s*[(（][^()（）]*[\u3400-\u9fff][^()（）]*[)）]")


# --- the corpus -----------------------------------------------------------------------------------------------


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def _paragraphs(text: str) -> list[str]:
    """English paragraphs of a docstring or Markdown text: prose lines joined into one line, indented or listed lines
    (code, Args: sections) kept as they are; Chinese glosses in parentheses, sentences with Chinese characters, code
    fences and tables left out."""
    out = []
    for block in re.split(r"\n\s*\n", text.strip()):
        block = GLOSS.sub("", block)  # "a KV cache (KV 缓存)" → "a KV cache"
        if CJK.search(block):
            block = " ".join(s for s in re.split(r"(?<=[.:;!?])\s+", block) if not CJK.search(s))
        lines = block.splitlines()
        if not lines or block.lstrip().startswith(("```", "|", "<")):
            continue
        structured = any(line.startswith((" ", "\t", "-", "*")) for line in lines[1:]) or lines[0].rstrip().endswith(":")
        out.append(block.strip() if structured else " ".join(line.strip() for line in lines))
    return out


def _docstrings(source: str) -> list[str]:
    """The docstrings of a module, in the order they appear (module, classes, functions)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    nodes.sort(key=lambda n: getattr(n, "lineno", 0))
    return [doc for n in nodes if (doc := ast.get_docstring(n))]


def build_corpus(rev: str) -> tuple[str, str]:
    """The corpus text at commit `rev` and that commit's full hash."""
    commit = _git("rev-parse", "--verify", rev + "^{commit}").strip()
    paths = [p for p in _git("ls-tree", "-r", "--name-only", commit).splitlines() if p.endswith(".py") and p.split("/")[0] in SOURCES]
    docs = []
    for path in sorted(paths):
        for doc in _docstrings(_git("show", f"{commit}:{path}")):
            if paragraphs := _paragraphs(doc):
                docs.append("\n\n".join(paragraphs))
    readme = _git("show", f"{commit}:README.md")
    for section in re.split(r"^#+ .*$", readme, flags=re.M):
        if paragraphs := _paragraphs(re.sub(r"```.*?```", "", section, flags=re.S)):
            docs.append("\n\n".join(paragraphs))
    return EOS.join(docs) + EOS, commit


def write_corpus(rev: str) -> None:
    text, commit = build_corpus(rev)
    CORPUS.write_bytes(lzma.compress(f"{commit}\n{text}".encode(), preset=9 | lzma.PRESET_EXTREME))
    print(f"{CORPUS.name}: {len(text):,} characters from {commit[:12]}, {CORPUS.stat().st_size:,} bytes compressed")


def read_corpus() -> tuple[str, str]:
    """The shipped corpus and the commit it came from."""
    commit, text = lzma.decompress(CORPUS.read_bytes()).decode().split("\n", 1)
    return text, commit


# --- the tokenizer and the model --------------------------------------------------------------------------------


def train_tokenizer(text: str, vocab_size: int):  # noqa: ANN201 (tokenizers has no type stubs)
    """A byte-level BPE (GPT-2's pre-tokenizer regex, as Qwen's tokenizer has), EOS as its one special token. Encoding
    with special tokens (what `engine.text` does) puts the EOS first, as a BOS: a prompt then starts where the model
    saw every document start, right after an EOS (Qwen's own tokenizer adds nothing)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(text.split(EOS), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{EOS} $A", special_tokens=[(EOS, tokenizer.token_to_id(EOS))])
    return tokenizer


def _lr(step: int, steps: int) -> float:
    """Linear warmup, then a cosine from LR down to MIN_LR at the last step."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * progress))


def train(out: Path, steps: int) -> dict:
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(SEED)
    torch.set_num_threads(THREADS)
    text, commit = read_corpus()
    tokenizer = train_tokenizer(text, CONFIG["vocab_size"])
    eos = tokenizer.token_to_id(EOS)
    docs = [tokenizer.encode(doc, add_special_tokens=False).ids for doc in text.split(EOS) if doc]
    ids = torch.tensor([t for doc in docs for t in [eos, *doc]], dtype=torch.long)
    doc_starts = (ids[: len(ids) - SEQ_LEN - 1] == eos).nonzero().flatten()
    print(f"corpus {len(text):,} characters, {len(ids):,} tokens; {steps} steps of {BATCH}×{SEQ_LEN}")

    config = {**CONFIG, "eos_token_id": eos, "bos_token_id": eos}
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")}))
    model.config.output_router_logits = True  # training adds the load-balancing loss, so every expert learns
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}], lr=LR)
    order = torch.Generator().manual_seed(SEED)
    log, start = [], time.monotonic()
    model.train()
    for step in range(steps):
        anywhere = torch.randint(0, len(ids) - SEQ_LEN - 1, (BATCH // 2,), generator=order)
        at_doc = doc_starts[torch.randint(0, len(doc_starts), (BATCH - BATCH // 2,), generator=order)]
        starts = torch.cat([anywhere, at_doc])  # half the windows start at a document's EOS, as a prompt does
        batch = torch.stack([ids[s : s + SEQ_LEN] for s in starts.tolist()])
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps)
        result = model(input_ids=batch, labels=batch)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        lm_loss = float(result.loss.detach() - model.config.router_aux_loss_coef * result.aux_loss.detach())
        if step % 50 == 0 or step == steps - 1:
            log.append({"step": step, "lm_loss": round(lm_loss, 4), "aux_loss": round(float(result.aux_loss.detach()), 4)})
            print(f"step {step:>4}  loss {lm_loss:.3f}  aux {log[-1]['aux_loss']:.3f}  {time.monotonic() - start:.0f} s", flush=True)

    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in _hub_names(model.state_dict()).items() if k != "lm_head.weight"}
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tokenizer.save(str(out / "tokenizer.json"))
    record = {
        "seed": SEED,
        "steps": steps,
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "lr": LR,
        "threads": THREADS,
        "final_lm_loss": log[-1]["lm_loss"],
        "loss_log": log,
        "corpus": {
            "file": f"engine/models/{CORPUS.name}",
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "commit": commit,
            "characters": len(text),
            "tokens": len(ids),
            "sources": [*(f"{s}/**/*.py docstrings" for s in SOURCES), "README.md"],
        },
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.monotonic() - start),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def _hub_names(state: dict) -> dict:
    """transformers 5 holds each layer's experts fused ([E, 2I, H] gate|up, [E, H, I] down); checkpoints on the Hub
    (Qwen3-30B-A3B) name every expert's projections: mlp.experts.{e}.gate_proj.weight and so on."""
    out = {}
    for name, tensor in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name.removesuffix("gate_up_proj")
            for e, fused in enumerate(tensor):
                gate, up = fused.chunk(2)
                out[f"{prefix}{e}.gate_proj.weight"], out[f"{prefix}{e}.up_proj.weight"] = gate, up
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name.removesuffix("down_proj")
            for e, down in enumerate(tensor):
                out[f"{prefix}{e}.down_proj.weight"] = down
        else:
            out[name] = tensor
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the folder to write (default: the shipped one)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--corpus-from", metavar="REV", help="rebuild the shipped corpus from the repository at REV, then stop")
    args = parser.parse_args()
    if args.corpus_from:
        write_corpus(args.corpus_from)
        return
    record = train(args.out, args.steps)
    print(f"{args.out}: loss {record['final_lm_loss']}, {record['seconds']} s")


if __name__ == "__main__":
    main()
