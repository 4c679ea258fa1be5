"""ch30's reading of a configuration against a support matrix, for the explanations of 30.2 (never shipped).

Which requirement a release supports is check_support's answer; public checks reach these rows through
`grader.checks.ch30.support_models` (a `grader.authoring.hidden_model` driver).
"""

from __future__ import annotations


def support_rows(config: dict, matrix: dict) -> list[dict]:
    """Each requirement of the config: key, value, what the matrix allows, supported or not."""
    head_dim = config.get("head_dim")
    if head_dim is None:
        head_dim = config["hidden_size"] // config["num_attention_heads"]
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    dtype = config.get("dtype") or config.get("torch_dtype")
    rows = [
        dict(key="architecture", value=a, allowed=matrix["architectures"], ok=a in matrix["architectures"]) for a in config["architectures"]
    ]
    rows += [
        dict(key="dtype", value=dtype, allowed=matrix["dtypes"], ok=dtype in matrix["dtypes"]),
        dict(
            key="quantization",
            value=method if quant is not None else "none",
            allowed=matrix["quantization"],
            ok=quant is None or method in matrix["quantization"],
        ),
        dict(key="head_dim", value=head_dim, allowed=matrix["head_dims"], ok=head_dim in matrix["head_dims"]),
        dict(
            key="max_position_embeddings",
            value=config["max_position_embeddings"],
            allowed=f"≤ {matrix['max_context']}",
            ok=config["max_position_embeddings"] <= matrix["max_context"],
        ),
        dict(
            key="tensor_parallel_size",
            value=config.get("tensor_parallel_size", 1),
            allowed=matrix["tensor_parallel_sizes"],
            ok=config.get("tensor_parallel_size", 1) in matrix["tensor_parallel_sizes"],
        ),
    ]
    for f in dict.fromkeys(config.get("features", [])):
        allowed = ("yes" if matrix["features"][f] else "no") if f in matrix["features"] else "not listed"
        rows.append(dict(key=f, value="requested", allowed=allowed, ok=allowed == "yes", feature=True))
    return rows


def support_models(ref, config: dict, matrix: dict) -> list[dict]:
    """`support_rows` as a driver; with the reference at hand, the rows must name what it names unsupported."""
    rows = support_rows(config, matrix)
    if ref is not None:
        named = sorted(entry.split(":", 1)[0].strip() for entry in ref.check_support(config, matrix))
        if named != sorted(r["key"] for r in rows if not r["ok"]):
            raise AssertionError(f"grader error: the support rows disagree with the reference ({named})")
    return rows
