"""A Qwen3 model as the engine holds it: a validated config and the weights, fused as nano-vllm fuses them.

A model comes from a local Hugging Face–format folder (`config.json` and
`model.safetensors`, or shards listed in `model.safetensors.index.json`; nothing is
downloaded) or from a named preset whose weights are drawn from a seed. Loading fuses
q_proj | k_proj | v_proj into one `qkv` weight and gate_proj | up_proj into one
`gate_up` weight (nano-vllm's packed modules); saving splits them back, so a saved
preset loads into transformers' `Qwen3ForCausalLM` unchanged.

A Qwen3-MoE model (`model_type: "qwen3_moe"`, transformers' `Qwen3MoeForCausalLM`) has a
mixture of experts in place of the MLP in its sparse layers: a router [E, H] and E
experts, each a SwiGLU MLP of width `moe_intermediate_size`, held stacked ([E, 2I, H]
gate | up, [E, H, I] down; transformers holds them the same way). Its checkpoints name
every expert's projections apart (`mlp.experts.E.gate_proj.weight`, what
`save_pretrained` writes) or stacked (`mlp.experts.gate_up_proj`); both load.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from engine.words import tr

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
    num_experts: int = 0
    """Qwen3-MoE: experts per sparse layer (0: a dense Qwen3)."""
    num_experts_per_tok: int = 0
    """Qwen3-MoE: k, the experts each token is routed to."""
    moe_intermediate_size: int = 0
    """Qwen3-MoE: the width of one expert's SwiGLU MLP."""
    norm_topk_prob: bool = False
    """Qwen3-MoE: renormalise each token's k routing weights to sum to 1."""
    decoder_sparse_step: int = 1
    """Qwen3-MoE: layer i has experts when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers."""
    mlp_only_layers: tuple[int, ...] = ()
    """Qwen3-MoE: layers that keep a dense MLP (of intermediate_size)."""

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
        if self.num_experts:
            self._check_moe()

    def _check_moe(self) -> None:
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ModelError(f"config {name} must be a positive int in a Qwen3-MoE config; got {value!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ModelError(f"num_experts_per_tok={self.num_experts_per_tok} exceeds num_experts={self.num_experts}")
        if any(type(i) is not int or not 0 <= i < self.num_hidden_layers for i in self.mlp_only_layers):
            last = self.num_hidden_layers - 1
            raise ModelError(f"mlp_only_layers must list layer indices in 0 … {last}; got {list(self.mlp_only_layers)}")

    @property
    def is_moe(self) -> bool:
        """A Qwen3-MoE model: some layer routes its tokens to experts."""
        return any(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer` has a mixture of experts (transformers' Qwen3MoeDecoderLayer's rule) or a dense MLP."""
        return self.num_experts > 0 and layer not in self.mlp_only_layers and (layer + 1) % self.decoder_sparse_step == 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def num_parameters(self) -> int:
        H, I, d = self.hidden_size, self.intermediate_size, self.head_dim
        Hq, Hkv = self.num_attention_heads, self.num_key_value_heads
        attention = (Hq + 2 * Hkv) * d * H + H * Hq * d + 2 * d + 2 * H
        experts = self.num_experts * (H + 3 * H * self.moe_intermediate_size)  # the router's row and the expert's MLP
        layers = sum(attention + (experts if self.is_moe_layer(i) else 3 * H * I) for i in range(self.num_hidden_layers))
        return self.vocab_size * H * (1 if self.tie_word_embeddings else 2) + layers + H

    @classmethod
    def from_hf(cls, config: dict) -> ModelConfig:
        """Read a Hugging Face Qwen3 or Qwen3-MoE `config.json`; refuse what the engine does not implement."""
        model_type = config.get("model_type", "qwen3")
        if model_type not in ("qwen3", "qwen3_moe"):
            raise ModelError(f"the engine runs Qwen3 and Qwen3-MoE models; this config has model_type {model_type!r}")
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
            **(_moe_fields(config) if model_type == "qwen3_moe" else {}),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
            max_position_embeddings=int(config.get("max_position_embeddings", 40960)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            dtype=str(config.get("dtype") or config.get("torch_dtype") or "float32"),
        )

    def to_hf(self) -> dict:
        """The config as a Hugging Face `config.json` that transformers' Qwen3ForCausalLM (Qwen3MoeForCausalLM for a
        mixture of experts) loads."""
        hf = {k: v for k, v in asdict(self).items() if k not in ("dtype", "rope_theta", *MOE_FIELDS)}
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        moe = {k: getattr(self, k) for k in MOE_FIELDS} | {"mlp_only_layers": list(self.mlp_only_layers)} if self.num_experts else {}
        return {
            "architectures": ["Qwen3MoeForCausalLM" if self.num_experts else "Qwen3ForCausalLM"],
            "model_type": "qwen3_moe" if self.num_experts else "qwen3",
            **hf,
            **moe,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            "attention_bias": False,
            "use_sliding_window": False,
            "dtype": self.dtype,
        }


MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")
"""The Qwen3-MoE fields of a config, in the Hugging Face config's names."""

UNSUPPORTED_MOE = {
    "shared_expert_intermediate_size": "shared experts (Qwen2-MoE's shared_expert)",
    "n_shared_experts": "shared experts (DeepSeek's)",
    "num_shared_experts": "shared experts",
    "moe_shared_expert_intermediate_size": "shared experts",
    "n_group": "grouped top-k routing (DeepSeek-V3's expert groups)",
    "topk_group": "grouped top-k routing (DeepSeek-V3's expert groups)",
    "first_k_dense_replace": "DeepSeek's leading dense layers (Qwen3-MoE uses mlp_only_layers)",
}
"""Config fields of other mixtures of experts the engine does not implement: a config that sets one is refused by name."""


def _moe_fields(config: dict) -> dict:
    """The Qwen3-MoE fields of a Hugging Face config (transformers writes num_experts as num_local_experts)."""
    for name, what in UNSUPPORTED_MOE.items():
        if config.get(name):
            raise ModelError(f"config {name}={config[name]!r}: {what} are not implemented; the engine runs Qwen3-MoE's routed experts only")
    if config.get("scoring_func", "softmax") != "softmax":
        raise ModelError(f"config scoring_func={config['scoring_func']!r}: the engine routes with a softmax over the experts only")
    if config.get("routed_scaling_factor", 1.0) != 1.0:
        raise ModelError(f"config routed_scaling_factor={config['routed_scaling_factor']!r} is not implemented (Qwen3-MoE scales by 1)")
    experts = config.get("num_experts", config.get("num_local_experts"))
    present = {"num_experts": experts} | {k: config.get(k) for k in ("num_experts_per_tok", "moe_intermediate_size")}
    missing = [k for k, v in present.items() if v is None]
    if missing:
        raise ModelError(f"this Qwen3-MoE config.json lacks {', '.join(missing)}")
    return {
        "num_experts": experts,
        "num_experts_per_tok": config["num_experts_per_tok"],
        "moe_intermediate_size": config["moe_intermediate_size"],
        "norm_topk_prob": bool(config.get("norm_topk_prob", False)),
        "decoder_sparse_step": config.get("decoder_sparse_step", 1),
        "mlp_only_layers": tuple(config.get("mlp_only_layers") or ()),
    }


TINY = ModelConfig(
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rope_theta=10_000.0,
    max_position_embeddings=512,
)
"""The tiny dense preset: head_dim 32 ≠ hidden 64 / 4 heads."""

PRESETS = {
    "tiny": TINY,
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
    "tiny-moe": replace(TINY, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
}
"""Models whose weights are drawn from a seed: `tiny` (head_dim 32 ≠ hidden 64 / 4 heads), Qwen3-0.6B's shape, and
`tiny-moe`, tiny's shape as a Qwen3-MoE (8 experts of width 32 in both layers, top-2, renormalised)."""

SHIPPED = {"qwen3-course": Path(__file__).resolve().parent / "models" / "qwen3-course"}
"""Trained models in the package, by name: `qwen3-course` (the engine's default) is a tiny Qwen3-MoE that writes the
course's English prose, with its tokenizer (engine/models/train_qwen3_course.py made it)."""


def folder_of(name_or_folder: str | Path) -> Path | None:
    """The folder a model is read from: a shipped model's, or the folder given; None for a preset."""
    name = str(name_or_folder)
    if name in PRESETS:
        return None
    return SHIPPED.get(name, Path(name_or_folder))


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer, weights stored [out, in] (nn.Linear's convention)."""

    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2·Hkv)·d, H], packed q | k | v
    q_norm: torch.Tensor  # [d], shared by all query heads
    k_norm: torch.Tensor  # [d]
    o_proj: torch.Tensor  # [H, Hq·d]
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor | None  # [2I, H], packed gate | up; None in a layer of experts
    down: torch.Tensor | None  # [H, I]; None in a layer of experts
    moe: MoeWeights | None = None
    """The layer's mixture of experts (Qwen3-MoE's sparse layers), in place of gate_up and down."""


@dataclass(slots=True)
class MoeWeights:
    """One layer's mixture of experts: the router and E SwiGLU experts, stacked on a leading expert dimension."""

    router: torch.Tensor  # [E, H]: one logit per expert
    gate_up: torch.Tensor  # [E, 2I, H]: expert e's packed gate | up is gate_up[e], as a dense layer's
    down: torch.Tensor  # [E, H, I]


@dataclass(slots=True)
class Model:
    """A config and its weights; with tied embeddings `lm_head` *is* `embed`."""

    config: ModelConfig
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]
    source: str = field(default="")
    """Where the model came from, for a person (in the run's language): a preset and its seed, a shipped model, a folder."""
    random_weights: bool = False
    """Weights drawn from a seed (a preset): its tokens mean nothing."""

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights in Hugging Face's names, fused ones split back (no lm_head.weight when tied, as HF saves)."""
        c = self.config
        q_size, kv_size = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        tensors = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm}
        for i, lw in enumerate(self.layers):
            p = f"model.layers.{i}."
            q, k, v = lw.qkv.split([q_size, kv_size, kv_size])
            tensors |= {
                p + "input_layernorm.weight": lw.input_norm,
                p + "post_attention_layernorm.weight": lw.post_norm,
                p + "self_attn.q_proj.weight": q,
                p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v,
                p + "self_attn.o_proj.weight": lw.o_proj,
                p + "self_attn.q_norm.weight": lw.q_norm,
                p + "self_attn.k_norm.weight": lw.k_norm,
            }
            tensors |= _mlp_state_dict(p, lw)
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


def _mlp_state_dict(prefix: str, lw: LayerWeights) -> dict[str, torch.Tensor]:
    """A layer's MLP in Hugging Face's names: the dense gate/up/down, or the router and every expert's own three
    (what `Qwen3MoeForCausalLM.save_pretrained` writes in transformers 5.24)."""
    p = prefix + "mlp."
    if lw.moe is None:
        assert lw.gate_up is not None and lw.down is not None  # a dense layer has both
        gate, up = lw.gate_up.chunk(2)
        return {p + "gate_proj.weight": gate, p + "up_proj.weight": up, p + "down_proj.weight": lw.down}
    tensors = {p + "gate.weight": lw.moe.router}
    for e, (gate_up, down) in enumerate(zip(lw.moe.gate_up, lw.moe.down)):
        gate, up = gate_up.chunk(2)
        named = {"gate_proj": gate, "up_proj": up, "down_proj": down}
        tensors |= {f"{p}experts.{e}.{n}.weight": t for n, t in named.items()}
    return tensors


def random_model(config: ModelConfig, seed: int = 0) -> Model:
    """Weights drawn from `seed`: embeddings N(0, 1), linears N(0, 1/in) so activations stay O(1), norm weights
    near 1. The two projections that write into the residual stream (o_proj, down_proj) get 4× that scale: with
    tied embeddings a stream still dominated by its own token's embedding would only ever repeat that token.
    The logits stay well apart (no near-ties for greedy decoding to trip on). A layer of experts draws its router
    and each expert as a dense layer's linears (its output, a weighted mean of k experts, has a dense MLP's scale)."""
    g = torch.Generator().manual_seed(seed)
    dt = config.torch_dtype
    H, I, d = config.hidden_size, config.intermediate_size, config.head_dim
    Hq, Hkv = config.num_attention_heads, config.num_key_value_heads

    def linear(out_features: int, in_features: int, gain: float = 1.0) -> torch.Tensor:
        return (torch.randn(out_features, in_features, generator=g) * gain * in_features**-0.5).to(dt)

    def norm(width: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(width, generator=g)).to(dt)

    def experts() -> MoeWeights:
        E, Ie = config.num_experts, config.moe_intermediate_size
        gate_up = torch.stack([linear(2 * Ie, H) for _ in range(E)])
        return MoeWeights(router=linear(E, H), gate_up=gate_up, down=torch.stack([linear(H, Ie, gain=4.0) for _ in range(E)]))

    embed = torch.randn(config.vocab_size, H, generator=g).to(dt)
    layers = []
    for i in range(config.num_hidden_layers):  # drawn in field order, the layer's MLP or experts last
        input_norm, qkv, q_norm, k_norm = norm(H), linear((Hq + 2 * Hkv) * d, H), norm(d), norm(d)
        o_proj, post_norm = linear(H, Hq * d, gain=4.0), norm(H)
        moe = experts() if config.is_moe_layer(i) else None
        gate_up = None if moe is not None else linear(2 * I, H)
        down = None if moe is not None else linear(H, I, gain=4.0)
        layers.append(LayerWeights(input_norm, qkv, q_norm, k_norm, o_proj, post_norm, gate_up, down, moe))
    lm_head = embed if config.tie_word_embeddings else linear(config.vocab_size, H)
    return Model(config, embed, layers, norm(H), lm_head, source=tr("random weights, seed {seed}", seed=seed), random_weights=True)


def load(name_or_folder: str | Path, *, seed: int = 0, dtype: str | None = None) -> Model:
    """A preset by name (weights from `seed`), a shipped model by name (`SHIPPED`) or a local Hugging Face–format folder.

    Raises:
        ModelError: neither a preset nor a folder with config.json and safetensors weights, a config the
            engine does not implement, or weights missing or of the wrong shape.
    """
    name = str(name_or_folder)
    if name in PRESETS:
        config = PRESETS[name] if dtype is None else replace(PRESETS[name], dtype=dtype)
        model = random_model(config, seed)
        model.source = tr("preset {name}, {source}", name=repr(name), source=model.source)
        return model
    folder = SHIPPED.get(name, Path(name_or_folder))
    if not (folder / "config.json").is_file():
        raise ModelError(
            tr(
                "{name} is neither a preset ({presets}), a shipped model ({shipped}) nor a folder with config.json",
                name=repr(name),
                presets=", ".join(PRESETS),
                shipped=", ".join(SHIPPED),
            )
        )
    config = ModelConfig.from_hf(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    if dtype is not None:
        config = replace(config, dtype=dtype)
    source = tr("{name} (shipped: trained on the course's prose)", name=name) if name in SHIPPED else str(folder)
    return _from_tensors(config, _read_safetensors(folder), source)


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        raise ModelError(tr("{folder} has no model.safetensors (nor model.safetensors.index.json)", folder=folder))
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

    def experts(p: str) -> MoeWeights:
        """A layer's router and experts, from per-expert tensors or transformers' stacked ones."""
        E, Ie = config.num_experts, config.moe_intermediate_size
        router = take(p + "gate.weight", (E, H))
        if p + "experts.gate_up_proj" in tensors:
            return MoeWeights(router, take(p + "experts.gate_up_proj", (E, 2 * Ie, H)), take(p + "experts.down_proj", (E, H, Ie)))
        expert = lambda e, n, shape: take(f"{p}experts.{e}.{n}.weight", shape)
        gate_up = torch.stack([torch.cat([expert(e, "gate_proj", (Ie, H)), expert(e, "up_proj", (Ie, H))]) for e in range(E)])
        return MoeWeights(router, gate_up, torch.stack([expert(e, "down_proj", (H, Ie)) for e in range(E)]))

    layers = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        attn = lambda n, shape: take(f"{p}self_attn.{n}.weight", shape)
        mlp = lambda n, shape: take(f"{p}mlp.{n}.weight", shape)
        moe = experts(p + "mlp.") if config.is_moe_layer(i) else None
        layers.append(
            LayerWeights(
                input_norm=take(p + "input_layernorm.weight", (H,)),
                qkv=torch.cat([attn("q_proj", (Hq * d, H)), attn("k_proj", (Hkv * d, H)), attn("v_proj", (Hkv * d, H))]),
                q_norm=attn("q_norm", (d,)),
                k_norm=attn("k_norm", (d,)),
                o_proj=attn("o_proj", (H, Hq * d)),
                post_norm=take(p + "post_attention_layernorm.weight", (H,)),
                gate_up=None if moe is not None else torch.cat([mlp("gate_proj", (I, H)), mlp("up_proj", (I, H))]),
                down=None if moe is not None else mlp("down_proj", (H, I)),
                moe=moe,
            )
        )
    embed = take("model.embed_tokens.weight", (V, H))
    lm_head = embed if config.tie_word_embeddings else take("lm_head.weight", (V, H))
    return Model(config, embed, layers, take("model.norm.weight", (H,)), lm_head, source=source)
