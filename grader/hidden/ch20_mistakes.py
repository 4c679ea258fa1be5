"""ch20 · pre-norm, RMSNorm, SwiGLU: the common mistakes, each with the hint that names it and the edit of the
reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

NORM = "normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)"
MEAN_SQUARE = "xf.pow(2).mean(dim=-1, keepdim=True)"
RMS_RETURN = "xf.pow(2).mean(dim=-1, keepdim=True) + eps)\n    return (normed.to(x.dtype) * weight).to(x.dtype)"
ADD_RETURN = "    return (normed.to(x.dtype) * weight).to(x.dtype), s.to(x.dtype)"
ACT_SPLIT = "    gate, up = gate_up.float().chunk(2, dim=-1)"
ACT_RETURN = "    return (F.silu(gate) * up).to(gate_up.dtype)"
MLP = "F.linear(silu_and_mul(F.linear(x, gate_up_weight)), down_weight)"

MISTAKES = [
    # -- ch20.1 rms_norm ------------------------------------------------------------------------------------
    mistake(
        "layernorm",
        "ch20.1",
        "RMSNorm does not subtract the mean (that is LayerNorm): x / √(mean(x²) + eps) · w",
        ("    xf = x.float()\n", "    xf = x.float()\n    xf = xf - xf.mean(dim=-1, keepdim=True)\n"),
    ),
    mistake(
        "token_axis",
        "ch20.1",
        "normalise each token over its hidden channels (the last dimension), not over the tokens",
        (MEAN_SQUARE, "xf.pow(2).mean(dim=0, keepdim=True)"),
    ),
    mistake(
        "eps_outside",
        "ch20.1",
        "eps goes inside the root: x · rsqrt(mean(x²) + eps), not x / (√mean(x²) + eps)",
        (NORM, "normed = xf / (xf.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps)"),
    ),
    mistake("all_dims", "ch20.1", "normalise each token on its own, over the last dimension", (MEAN_SQUARE, "xf.pow(2).mean()")),
    mistake(
        "weight_first",
        "ch20.1",
        "cast the normalised x back to {dtype} first, then multiply by the weight (nano-vllm: "
        "x.to(orig_dtype).mul_(weight)); multiplying in float32 rounds differently",
        (RMS_RETURN, RMS_RETURN.replace("(normed.to(x.dtype) * weight)", "(normed * weight.float())")),
    ),
    mistake(
        "no_weight",
        "ch20.1",
        "multiply by the weight after normalising",
        (RMS_RETURN, RMS_RETURN.replace("(normed.to(x.dtype) * weight).to(x.dtype)", "normed.to(x.dtype)")),
    ),
    mistake(
        "sum_of_squares",
        "ch20.1",
        "use the mean of x², not the sum: divide by √(mean(x²) + eps)",
        (MEAN_SQUARE, "xf.pow(2).sum(dim=-1, keepdim=True)"),
    ),
    mistake(
        "mean_square",
        "ch20.1",
        "divide by the root of the mean square, √(mean(x²) + eps), not by the mean square itself",
        (NORM, "normed = xf / (xf.pow(2).mean(dim=-1, keepdim=True) + eps)"),
    ),
    # -- ch20.2 add_rms_norm --------------------------------------------------------------------------------
    mistake(
        "pair_order",
        "ch20.2",
        "the order is (normed, new_residual)",
        (ADD_RETURN, "    return s.to(x.dtype), (normed.to(x.dtype) * weight).to(x.dtype)"),
    ),
    mistake(
        "normed_residual",
        "ch20.2",
        "the residual stream carries the un-normalised sum s = x + residual; the normalised s goes only into the "
        "sublayer. Return (normed, s)",
        (ADD_RETURN, "    out = (normed.to(x.dtype) * weight).to(x.dtype)\n    return out, out"),
    ),
    mistake(
        "old_residual",
        "ch20.2",
        "the new residual is the sum x + residual, not the old residual",
        (ADD_RETURN, "    return (normed.to(x.dtype) * weight).to(x.dtype), residual"),
    ),
    mistake(
        "x_as_residual",
        "ch20.2",
        "the new residual is the sum x + residual, not x",
        (ADD_RETURN, "    return (normed.to(x.dtype) * weight).to(x.dtype), x"),
    ),
    mistake(
        "layer0_none",
        "ch20.2",
        "with residual None (layer 0) the new residual is x itself: the embedding starts the residual stream",
        ("        return rms_norm(x, weight, eps), x", "        return rms_norm(x, weight, eps), None"),
    ),
    mistake(
        "x_alone",
        "ch20.2",
        "normalise the sum s = x + residual, not x alone",
        (
            "    normed = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)",
            "    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + eps)",
        ),
    ),
    mistake(
        "rounded_sum",
        "ch20.2",
        "the course follows nano-vllm, which normalises the float32 sum s and rounds only the copy carried on as the "
        "residual; vLLM's fused add + RMSNorm kernel and transformers normalise the {dtype} sum instead, an equally "
        "common convention that differs in the last bits, so here normalise s before rounding",
        ("    s = x.float() + residual.float()", "    s = (x + residual).float()"),
    ),
    mistake(
        "sum_weight_first",
        "ch20.2",
        "cast the normalised sum back to {dtype} first, then multiply by the weight",
        (ADD_RETURN, "    return (normed * weight.float()).to(x.dtype), s.to(x.dtype)"),
    ),
    # -- ch20.3 silu_and_mul (and the activation inside swiglu_mlp, ch20.4) ---------------------------------
    mistake(
        "halves_swapped",
        "ch20.3 ch20.4",
        "the first half of gate_up is the gate and the second half is up: SiLU(gate_up[..., :I]) · gate_up[..., I:]",
        (ACT_SPLIT, "    up, gate = gate_up.float().chunk(2, dim=-1)"),
    ),
    mistake(
        "even_and_odd",
        "ch20.3 ch20.4",
        "gate and up are the two halves gate_up[..., :I] and gate_up[..., I:], not the even and odd channels",
        (ACT_SPLIT, "    gate, up = gate_up.float()[..., 0::2], gate_up.float()[..., 1::2]"),
    ),
    mistake(
        "sigmoid",
        "ch20.3 ch20.4",
        "SiLU(z) = z · sigmoid(z), not sigmoid(z)",
        (ACT_RETURN, "    return (torch.sigmoid(gate) * up).to(gate_up.dtype)"),
    ),
    mistake(
        "relu",
        "ch20.3 ch20.4",
        "SwiGLU uses SiLU(z) = z · sigmoid(z), not ReLU",
        (ACT_RETURN, "    return (F.relu(gate) * up).to(gate_up.dtype)"),
    ),
    mistake(
        "gelu",
        "ch20.3 ch20.4",
        "SwiGLU uses SiLU(z) = z · sigmoid(z), not GELU",
        (ACT_RETURN, "    return (F.gelu(gate) * up).to(gate_up.dtype)"),
    ),
    mistake(
        "silu_of_up",
        "ch20.3 ch20.4",
        "only the gate goes through SiLU; up is used as it is",
        (ACT_RETURN, "    return (F.silu(gate) * F.silu(up)).to(gate_up.dtype)"),
    ),
    mistake("no_up", "ch20.3 ch20.4", "multiply SiLU(gate) by the up half", (ACT_RETURN, "    return F.silu(gate).to(gate_up.dtype)")),
    # -- ch20.4 swiglu_mlp ----------------------------------------------------------------------------------
    mistake(
        "no_activation",
        "ch20.4",
        "apply SiLU(gate)·up between the two projections",
        (MLP, "F.linear(sum(F.linear(x, gate_up_weight).chunk(2, dim=-1)), down_weight)"),
    ),
    mistake(
        "mixes_tokens",
        "ch20.4",
        "the projections act on the last dimension (x · Wᵀ); nothing may reduce or mix along the token dimension",
        # every token's activation shifted by the batch mean: tokens see each other
        (MLP, "F.linear((lambda a: a - a.mean(dim=0, keepdim=True) + a[:1])(silu_and_mul(F.linear(x, gate_up_weight))), down_weight)"),
    ),
]
