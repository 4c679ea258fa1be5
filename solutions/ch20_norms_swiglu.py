"""Pre-Norm、RMSNorm 与 SwiGLU · pre-norm, RMSNorm, SwiGLU

A decoder layer of Qwen3 (like Llama's) is two *pre-norm* sublayers around one
residual stream: h ← h + Attention(RMSNorm(h)), then h ← h + MLP(RMSNorm(h)).
The norm sits at the entrance of each sublayer and only its input is normalised;
the residual stream itself carries the un-normalised sum from layer to layer
(Pre-Norm, 前置归一化). That keeps a clean identity path through all 28 layers.

RMSNorm (均方根归一化) rescales a vector by the root of its mean square, with no
mean subtraction and no bias: y = x / √(mean(x²) + eps) · w, over the hidden
dimension, with a learned weight w of width hidden. nano-vllm (bb823b3) and
Hugging Face compute it in float32 and **cast back to the model dtype (bf16)
before multiplying by the weight**; in bf16 the two orders round differently.

Engines fuse the residual add into the norm. nano-vllm's RMSNorm takes an optional
residual: `norm(x, residual)` computes s = x + residual in float32, returns the
normalised s for the sublayer and s itself (cast to bf16) as the new residual.
Layer 0 has no residual yet: its input_layernorm normalises the embedding and
the embedding becomes the residual. Each layer returns (mlp_output, residual)
without adding them: the next layer's input_layernorm (or the final norm) does
that add. The formula is the logical view; the fusion defers the add but keeps
the same data flow.

The MLP is SwiGLU: one merged projection gate_up = x·W_gate_upᵀ of width 2·I
(Qwen3-0.6B: 2·3072) whose **first half is the gate** and second half "up";
act = SiLU(gate) · up with SiLU(z) = z·sigmoid(z) (`SiluAndMul`), then
down = act·W_downᵀ back to the hidden width. Every token goes through it alone:
the MLP mixes channels, never tokens. Linear weights are stored [out, in] and
applied as x·Wᵀ (the nn.Linear convention).

Pre-Norm:每个子层入口做 RMSNorm,残差流保留未归一化的和;nano-vllm 把残差加法融合进下一个 norm。
SwiGLU:gate_up 前一半是 gate,SiLU(gate)·up 再经 down 投影,逐 token 变换、不混合 token。
"""

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension, as nano-vllm and Qwen3 compute it. Task ch20.1.

    In float32: x · rsqrt(mean(x²) + eps) over the last (hidden) dimension;
    then cast back to x's dtype, and only then multiply by the weight. (In bf16,
    multiplying in float32 before the cast rounds differently.) x is not modified.

    Args:
        x: [..., H] activations (any float dtype; bf16 in nano-vllm).
        weight: [H] learned scale (Qwen3 initialises it to ones).
        eps: added to the mean square (Qwen3: 1e-6).

    Returns:
        Tensor of x's shape and dtype.

    Raises:
        ValueError: x has no dimension, or weight is not [H] with H = x.shape[-1].

    Example:
        >>> rms_norm(torch.tensor([1., 2., 3., 4.]), torch.ones(4))   # mean square 7.5
        tensor([0.3651, 0.7303, 1.0954, 1.4606])
    """
    _check_norm(x, weight)
    ### BEGIN SOLUTION
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed.to(x.dtype) * weight).to(x.dtype)
    ### END SOLUTION


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused residual add + RMSNorm of nano-vllm's pre-norm layer. Task ch20.2.

    With a residual: s = float32(x) + float32(residual);
    new_residual = s cast to x's dtype (the residual stream goes on with the sum);
    normed = RMSNorm of the **float32** s (not of the rounded copy), cast to x's
    dtype, times the weight. That is nano-vllm's order; vLLM's fused kernel and
    transformers normalise the rounded sum instead, which differs in the last
    bits. With residual None (layer 0's input_layernorm):
    normed = rms_norm(x) and the new residual is x itself, the embedding.
    Inputs are not modified.

    Args:
        x: [..., H] the previous sublayer's output (or the embedding in layer 0).
        residual: [..., H] the residual stream so far, or None.
        weight: [H] the norm's weight.
        eps: added to the mean square.

    Returns:
        (normed, new_residual), both of x's shape and dtype: normed goes into the
        sublayer, new_residual is carried to the next add.

    Raises:
        ValueError: residual not of x's shape; weight not [H].

    Example:
        >>> normed, res = add_rms_norm(torch.ones(4), torch.tensor([0., 1., 2., 3.]), torch.ones(4))
        >>> res, normed
        (tensor([1., 2., 3., 4.]), tensor([0.3651, 0.7303, 1.0954, 1.4606]))
    """
    _check_add(x, residual, weight)
    ### BEGIN SOLUTION
    if residual is None:
        return rms_norm(x, weight, eps), x
    s = x.float() + residual.float()
    normed = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed.to(x.dtype) * weight).to(x.dtype), s.to(x.dtype)
    ### END SOLUTION


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation: SiLU of the first half times the second half. Task ch20.3.

    Split the last dimension into two equal halves, gate = gate_up[..., :I] and
    up = gate_up[..., I:] (the **first half is the gate**, as in nano-vllm's
    SiluAndMul and the merged gate_up_proj), and return SiLU(gate) · up with
    SiLU(z) = z · sigmoid(z). Computed in float32 and cast back to the input
    dtype once (as nano-vllm's compiled kernel does; an eager bf16 version may
    differ by one rounding step, which the checks accept).

    Args:
        gate_up: [..., 2I] the merged projection's output.

    Returns:
        Tensor [..., I] in gate_up's dtype.

    Raises:
        ValueError: the last dimension is odd (it cannot split into gate | up),
            or gate_up has no dimension.

    Example:
        >>> silu_and_mul(torch.tensor([1., -1., 2., 3.]))   # gate [1, -1], up [2, 3]
        tensor([ 1.4621, -0.8068])
    """
    _check_gate_up(gate_up)
    ### BEGIN SOLUTION
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)
    ### END SOLUTION


def swiglu_mlp(x: torch.Tensor, gate_up_weight: torch.Tensor, down_weight: torch.Tensor) -> torch.Tensor:
    """Qwen3's MLP: merged gate|up projection, SiLU-and-mul, down projection. Task ch20.4.

    gate_up = x · gate_up_weightᵀ ([..., 2I], gate first), act = silu_and_mul(gate_up)
    ([..., I]), out = act · down_weightᵀ ([..., H]). Weights are stored [out, in]
    (nn.Linear), so gate_up_weight is [2I, H] and down_weight is [H, I]. Each token
    is transformed on its own: permuting the tokens permutes the outputs.
    (nano-vllm shards these weights over tensor-parallel ranks; the course uses
    one rank.)

    Args:
        x: [..., H] tokens (any leading shape).
        gate_up_weight: [2I, H], rows 0 … I−1 the gate projection, rows I … 2I−1 up.
        down_weight: [H, I].

    Returns:
        Tensor [..., H] in x's dtype.

    Raises:
        ValueError: a weight stored [in, out] (transposed), an odd number of
            gate_up rows, or widths that do not match x or each other.

    Example:
        >>> x = torch.tensor([[1., 2.]])
        >>> w_gu = torch.tensor([[1., 0.], [0., 1.]])      # I = 1: gate = x0, up = x1
        >>> swiglu_mlp(x, w_gu, torch.tensor([[1.], [2.]]))   # silu(1)·2 = 1.4621
        tensor([[1.4621, 2.9242]])
    """
    _check_mlp(x, gate_up_weight, down_weight)
    ### BEGIN SOLUTION
    return F.linear(silu_and_mul(F.linear(x, gate_up_weight)), down_weight)
    ### END SOLUTION


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_norm(x: torch.Tensor, weight: torch.Tensor) -> None:
    """Provided: raise ValueError unless x has a last dimension H and weight is [H]."""
    if x.dim() == 0:
        raise ValueError("x must have a hidden dimension to normalise over; got a scalar")
    if list(weight.shape) != [x.shape[-1]]:
        raise ValueError(f"weight must be [H] = [{x.shape[-1]}], one scale per channel of x's last dimension; "
                         f"got {list(weight.shape)}")


def _check_add(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor) -> None:
    """Provided: raise ValueError unless x and weight pass _check_norm and a residual (if any) has x's shape."""
    _check_norm(x, weight)
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {list(x.shape)}; got {list(residual.shape)}")


def _check_gate_up(gate_up: torch.Tensor) -> None:
    """Provided: raise ValueError unless gate_up has a last dimension of even width 2I (gate | up)."""
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dimension holds gate | up, two halves of width I, so it must be even; "
                         f"got shape {list(gate_up.shape)}")


def _check_mlp(x: torch.Tensor, gate_up_weight: torch.Tensor, down_weight: torch.Tensor) -> None:
    """Provided: raise ValueError unless x is [..., H], gate_up_weight [2I, H] and down_weight [H, I], both weights
    stored [out, in] (a transposed one is named as such)."""
    if x.dim() == 0 or gate_up_weight.dim() != 2 or down_weight.dim() != 2:
        raise ValueError(f"x must be [..., H] and both weights 2-D; got x {list(x.shape)}, gate_up_weight "
                         f"{list(gate_up_weight.shape)}, down_weight {list(down_weight.shape)}")
    h = x.shape[-1]
    two_i = gate_up_weight.shape[0]
    if gate_up_weight.shape[1] != h:
        flipped = " (it looks transposed: weights are stored [out, in])" if two_i == h else ""
        raise ValueError(f"gate_up_weight must be [2I, H] = [2I, {h}], stored [out, in] like nn.Linear; "
                         f"got {list(gate_up_weight.shape)}{flipped}")
    if two_i % 2:
        raise ValueError(f"gate_up_weight has {two_i} rows: gate | up needs an even number 2I")
    if list(down_weight.shape) != [h, two_i // 2]:
        flipped = " (it looks transposed: weights are stored [out, in])" \
            if list(down_weight.shape) == [two_i // 2, h] else ""
        raise ValueError(f"down_weight must be [H, I] = [{h}, {two_i // 2}], stored [out, in]; "
                         f"got {list(down_weight.shape)}{flipped}")
