"""A Qwen3 model as the engine holds it: a validated config and the weights, fused as nano-vllm fuses them.

A model comes from a local Hugging Face–format folder (`config.json` and
`model.safetensors`, or shards listed in `model.safetensors.index.json`; nothing is
downloaded) or from a named preset whose weights are drawn from a seed. Loading fuses
q_proj | k_proj | v_proj into one `qkv` weight and gate_proj | up_proj into one
`gate_up` weight (nano-vllm's packed modules); saving splits them back, so a saved
preset loads into transformers' `Qwen3ForCausalLM` unchanged.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

WIDTHS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(ValueError):
    """A model folder or config the engine cannot run, with the reason."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The widths of a Qwen3 model, in the Hugging Face config's names. head_dim is a config value of its
    own (Qwen3-0.6B: 128, not hidden_size / num_attention_heads = 64)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = True
    eos_token_id: int | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in WIDTHS + ("max_position_embeddings",):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ModelError(f"config {name} must be a positive int; got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelError(
                f"num_key_value_heads={self.num_key_value_heads} must divide num_attention_heads={self.num_attention_heads} (GQA groups)"
            )
        if self.head_dim % 2:
            raise ModelError(f"head_dim must be even (RoPE rotates pairs of channels); got {self.head_dim}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ModelError(f"rms_norm_eps and rope_theta must be positive; got {self.rms_norm_eps}, {self.rope_theta}")
        if self.dtype not in DTYPES:
            raise ModelError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.eos_token_id is not None and not 0 <= self.eos_token_id < self.vocab_size:
            raise ModelError(f"eos_token_id {self.eos_token_id} is outside the vocabulary of {self.vocab_size}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def num_parameters(self) -> int:
        H, I, d = self.hidden_size, self.intermediate_size, self.head_dim
        Hq, Hkv = self.num_attention_heads, self.num_key_value_heads
        layer = (Hq + 2 * Hkv) * d * H + H * Hq * d + 2 * d + 3 * H * I + 2 * H
        return self.vocab_size * H * (1 if self.tie_word_embeddings else 2) + self.num_hidden_layers * layer + H

    @classmethod
    def from_hf(cls, config: dict) -> ModelConfig:
        """Read a Hugging Face Qwen3 `config.json`; refuse what the engine does not implement."""
        if config.get("model_type", "qwen3") != "qwen3":
            raise ModelError(f"the engine runs Qwen3 models; this config has model_type {config.get('model_type')!r}")
        missing = [k for k in WIDTHS if k not in config]
        if missing:
            raise ModelError(
                f"config.json lacks {', '.join(missing)} (head_dim is read from the config, never "
                f"derived from hidden_size / num_attention_heads)"
            )
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ModelError(
                f"RoPE scaling {rope.get('rope_type', rope.get('type'))!r} is not implemented; the engine rotates with plain RoPE"
            )
        unsupported = [k for k in ("attention_bias", "use_sliding_window") if config.get(k)]
        if config.get("hidden_act", "silu") != "silu" or unsupported:
            raise ModelError(
                f"not a plain Qwen3 config: hidden_act {config.get('hidden_act')!r}, {', '.join(unsupported) or 'no unsupported flags'}"
            )
        eos = config.get("eos_token_id")
        return cls(
            **{k: config[k] for k in WIDTHS},
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
            max_position_embeddings=int(config.get("max_position_embeddings", 40960)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            dtype=str(config.get("dtype") or config.get("torch_dtype") or "float32"),
        )

    def to_hf(self) -> dict:
        """The config as a Hugging Face `config.json` that transformers' Qwen3ForCausalLM loads."""
        hf = {k: v for k, v in asdict(self).items() if k not in ("dtype", "rope_theta")}
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **hf,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "attention_bias": False,
            "use_sliding_window": False,
            "dtype": self.dtype,
        }


PRESETS = {
    "tiny": ModelConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=10_000.0,
        max_position_embeddings=512,
    ),
    "qwen3-0.6b-shape": ModelConfig(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        eos_token_id=None,
    ),
}
"""Models whose weights are drawn from a seed: `tiny` (head_dim 32 ≠ hidden 64 / 4 heads) and Qwen3-0.6B's shape."""


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer, weights stored [out, in] (nn.Linear's convention)."""

    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2·Hkv)·d, H], packed q | k | v
    q_norm: torch.Tensor  # [d], shared by all query heads
    k_norm: torch.Tensor  # [d]
    o_proj: torch.Tensor  # [H, Hq·d]
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2I, H], packed gate | up
    down: torch.Tensor  # [H, I]


@dataclass(slots=True)
class Model:
    """A config and its weights; with tied embeddings `lm_head` *is* `embed`."""

    config: ModelConfig
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]
    source: str = field(default="")

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights in Hugging Face's names, fused ones split back (no lm_head.weight when tied, as HF saves)."""
        c = self.config
        q_size, kv_size = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        tensors = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm}
        for i, lw in enumerate(self.layers):
            p = f"model.layers.{i}."
            q, k, v = lw.qkv.split([q_size, kv_size, kv_size])
            gate, up = lw.gate_up.chunk(2)
            tensors |= {
                p + "input_layernorm.weight": lw.input_norm,
                p + "post_attention_layernorm.weight": lw.post_norm,
                p + "self_attn.q_proj.weight": q,
                p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v,
                p + "self_attn.o_proj.weight": lw.o_proj,
                p + "self_attn.q_norm.weight": lw.q_norm,
                p + "self_attn.k_norm.weight": lw.k_norm,
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": lw.down,
            }
        if not c.tie_word_embeddings:
            tensors["lm_head.weight"] = self.lm_head
        return tensors

    def save(self, folder: Path) -> Path:
        """Write `config.json` and `model.safetensors` in Hugging Face's names; returns the folder."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: t.contiguous().clone() for k, t in self.hf_state_dict().items()}, folder / "model.safetensors", metadata={"format": "pt"}
        )
        (folder / "config.json").write_text(json.dumps(self.config.to_hf(), indent=2) + "\n", encoding="utf-8")
        return folder


def random_model(config: ModelConfig, seed: int = 0) -> Model:
    """Weights drawn from `seed`: embeddings N(0, 1), linears N(0, 1/in) so activations stay O(1), norm weights
    near 1. The two projections that write into the residual stream (o_proj, down_proj) get 4× that scale: with
    tied embeddings a stream still dominated by its own token's embedding would only ever repeat that token.
    The logits stay well apart (no near-ties for greedy decoding to trip on)."""
    g = torch.Generator().manual_seed(seed)
    dt = config.torch_dtype
    H, I, d = config.hidden_size, config.intermediate_size, config.head_dim
    Hq, Hkv = config.num_attention_heads, config.num_key_value_heads

    def linear(out_features: int, in_features: int, gain: float = 1.0) -> torch.Tensor:
        return (torch.randn(out_features, in_features, generator=g) * gain * in_features**-0.5).to(dt)

    def norm(width: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(width, generator=g)).to(dt)

    embed = torch.randn(config.vocab_size, H, generator=g).to(dt)
    layers = [
        LayerWeights(
            input_norm=norm(H),
            qkv=linear((Hq + 2 * Hkv) * d, H),
            q_norm=norm(d),
            k_norm=norm(d),
            o_proj=linear(H, Hq * d, gain=4.0),
            post_norm=norm(H),
            gate_up=linear(2 * I, H),
            down=linear(H, I, gain=4.0),
        )
        for _ in range(config.num_hidden_layers)
    ]
    lm_head = embed if config.tie_word_embeddings else linear(config.vocab_size, H)
    return Model(config, embed, layers, norm(H), lm_head, source=f"random weights, seed {seed}")


def load(name_or_folder: str | Path, *, seed: int = 0, dtype: str | None = None) -> Model:
    """A preset by name (weights from `seed`) or a local Hugging Face–format folder.

    Raises:
        ModelError: neither a preset nor a folder with config.json and safetensors weights, a config the
            engine does not implement, or weights missing or of the wrong shape.
    """
    name = str(name_or_folder)
    if name in PRESETS:
        config = PRESETS[name] if dtype is None else replace(PRESETS[name], dtype=dtype)
        model = random_model(config, seed)
        model.source = f"preset {name!r}, {model.source}"
        return model
    folder = Path(name_or_folder)
    if not (folder / "config.json").is_file():
        raise ModelError(f"{name!r} is neither a preset ({', '.join(PRESETS)}) nor a folder with config.json")
    config = ModelConfig.from_hf(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    if dtype is not None:
        config = replace(config, dtype=dtype)
    return _from_tensors(config, _read_safetensors(folder), str(folder))


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        raise ModelError(f"{folder} has no model.safetensors (nor model.safetensors.index.json)")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors |= load_file(folder / shard)
    return tensors


def _from_tensors(config: ModelConfig, tensors: dict[str, torch.Tensor], source: str) -> Model:
    H, I, d, V = config.hidden_size, config.intermediate_size, config.head_dim, config.vocab_size
    Hq, Hkv = config.num_attention_heads, config.num_key_value_heads

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in tensors:
            raise ModelError(f"{source}: the weights lack {name}")
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise ModelError(f"{source}: {name} is {list(t.shape)}, the config says {list(shape)}")
        return t.to(config.torch_dtype)

    layers = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        attn = lambda n, shape: take(f"{p}self_attn.{n}.weight", shape)
        mlp = lambda n, shape: take(f"{p}mlp.{n}.weight", shape)
        layers.append(
            LayerWeights(
                input_norm=take(p + "input_layernorm.weight", (H,)),
                qkv=torch.cat([attn("q_proj", (Hq * d, H)), attn("k_proj", (Hkv * d, H)), attn("v_proj", (Hkv * d, H))]),
                q_norm=attn("q_norm", (d,)),
                k_norm=attn("k_norm", (d,)),
                o_proj=attn("o_proj", (H, Hq * d)),
                post_norm=take(p + "post_attention_layernorm.weight", (H,)),
                gate_up=torch.cat([mlp("gate_proj", (I, H)), mlp("up_proj", (I, H))]),
                down=mlp("down_proj", (H, I)),
            )
        )
    embed = take("model.embed_tokens.weight", (V, H))
    lm_head = embed if config.tie_word_embeddings else take("lm_head.weight", (V, H))
    return Model(config, embed, layers, take("model.norm.weight", (H,)), lm_head, source=source)
