# ch19 exercises: replace each TODO with your code, then run `course check ch19`.
"""旋转位置编码 · rotary position embedding

Attention compares every query with every key by a dot product, and a dot
product knows nothing about where the two tokens stand. Rotary position
embedding (RoPE, 旋转位置编码) puts the position into Q and K themselves: the
head_dim = d channels of a head are taken as d/2 two-dimensional pairs, and at
position p pair j is rotated by the angle p·θ_j, with one frequency per pair,

    θ_j = 1 / base^(2j/d),   j = 0 … d/2 − 1.

Pair 0 turns by one radian per position; the last pair barely moves over
thousands of positions. Since a rotation by p·θ followed by the transpose of a
rotation by p′·θ is a rotation by (p − p′)·θ, the score q·k of a query at p and a
key at p′ depends on the positions only through the difference p − p′: shift the
whole sequence and no score changes. A rotation also keeps every vector's length.

Which channels form a pair is a layout convention, and it must match the weights
the model was trained with. Qwen3, Llama and nano-vllm use the **half-split
("NeoX", rotate_half) layout**: pair j is (x[j], x[j + d/2]), so with
x1 = x[..., :d/2] and x2 = x[..., d/2:]

    y1 = x1·cos − x2·sin,   y2 = x2·cos + x1·sin.

The interleaved ("GPT-J") layout pairs (x[2j], x[2j + 1]) instead; it is an
equally good rotation, but applied to Qwen3's weights it scrambles the model.

nano-vllm (bb823b3) builds the table once: inv_freq in float32, angles
p·inv_freq for every position up to max_position (40960 for Qwen3-0.6B, base =
rope_theta = 1,000,000), cached as one float32 buffer [max_position, 1, d] laid
out as [cos | sin]. Each step gathers the rows of the step's positions and rotates
Q and K in float32, casting back to the model dtype. In Qwen3Attention the order
is: qkv projection, split into q | k | v, per-head RMSNorm of q and k (`q_norm`,
`k_norm`: over head_dim, one weight [d] shared by all heads), then RoPE on q and
k. V is neither normalised nor rotated: positions steer *which* keys a query
attends to; the values carry the content that is mixed.

旋转位置编码:把 head 的 d 个通道看成 d/2 个二维对子,第 j 对在位置 p 旋转 p·θ_j;nano-vllm 用半分(NeoX)布局,先对 q/k 做逐头 RMSNorm 再旋转,V 不旋转。
"""

import torch


def rope_cos_sin(positions: list[int] | torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles of each position, one per pair. Task ch19.1.

    Pair j of a head (j = 0 … d/2 − 1) turns with frequency
    inv_freq[j] = 1 / base^(2j/d); at position p its angle is p·inv_freq[j].
    Compute inv_freq and the angles in float32 as nano-vllm does
    (`1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float) / d)`), then take
    cos and sin. (nano-vllm precomputes these rows for every position up to
    max_position and keeps them as one [max_position, 1, d] cache laid out as
    [cos | sin]; the course computes the rows of the positions asked for.)

    Args:
        positions: int positions [N] (0-based, non-negative), a list or an
            integer tensor.
        head_dim: d, the width of one head (positive and even).
        base: the RoPE base θ (`rope_theta`: 1,000,000 for Qwen3, 10,000 in
            the original paper), > 0.

    Returns:
        (cos, sin), each a float32 tensor [N, d/2]: cos[n, j] = cos(p_n·inv_freq[j]).

    Raises:
        ValueError: head_dim odd or not positive (RoPE rotates pairs), base ≤ 0,
            positions not a 1-D list/tensor of non-negative integers.

    Example:
        >>> cos, sin = rope_cos_sin([0, 1], 4, 10000.0)    # inv_freq = [1, 0.01]
        >>> cos
        tensor([[1.0000, 1.0000],
                [0.5403, 0.9999]])
        >>> sin
        tensor([[0.0000, 0.0000],
                [0.8415, 0.0100]])
    """
    # TODO(ch19.1): your code here (about 19 lines)
    raise NotImplementedError("ch19.1 rope_cos_sin: not implemented yet (about 19 lines)")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate every head of every token by its position's angles (half-split layout). Task ch19.2.

    Pair j of a head is (x[j], x[j + d/2]), the NeoX / Hugging Face "rotate_half"
    layout that nano-vllm and Qwen3 use, not the interleaved (x[2j], x[2j + 1]).
    With x1 = x[..., :d/2] and x2 = x[..., d/2:], in float32:

        y1 = x1·cos − x2·sin,   y2 = x2·cos + x1·sin,   y = concat(y1, y2)

    cos and sin of token n broadcast over its heads. The result is cast back to
    x's dtype. x is not modified.

    Args:
        x: [N, H, d] queries or keys (any float dtype; bf16 in nano-vllm).
        cos: [N, d/2] cos of each token's angles (from `rope_cos_sin`).
        sin: [N, d/2] sin of the same angles.

    Returns:
        [N, H, d] tensor in x's dtype.

    Raises:
        ValueError: x not 3-D or with an odd head_dim; cos or sin not [N, d/2]
            (e.g. the full-width [N, d] tables of Hugging Face).

    Example:
        >>> cos, sin = rope_cos_sin([1], 4, 10000.0)
        >>> apply_rope(torch.tensor([[[1., 2., 3., 4.]]]), cos, sin)
        tensor([[[-1.9841,  1.9599,  2.4624,  4.0198]]])
    """
    # TODO(ch19.2): your code here (about 12 lines)
    raise NotImplementedError("ch19.2 apply_rope: not implemented yet (about 12 lines)")


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor,
                 positions: list[int] | torch.Tensor, base: float,
                 eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's q/k path: per-head RMSNorm, then RoPE; V is not touched. Task ch19.3.

    The order of nano-vllm's Qwen3Attention.forward:

    1. per-head RMSNorm of q and of k, over head_dim (every head separately,
       one weight [d] shared by all heads): in float32,
       x·rsqrt(mean(x²) + eps), cast back to the input dtype, then times the
       weight;
    2. RoPE (`rope_cos_sin` and `apply_rope`) of the normalised q and k at the
       tokens' positions.

    Normalising after the rotation is not the same: the weight scales channel j
    and channel j + d/2 differently, so it must act before they are mixed.
    V takes neither step, so it is not an argument. Inputs are not modified.

    Args:
        q: [N, Hq, d] queries of N tokens (after the projection, split into heads).
        k: [N, Hkv, d] keys, same N, d and dtype as q.
        q_norm_weight: [d] weight of q_norm.
        k_norm_weight: [d] weight of k_norm.
        positions: [N] int positions of the tokens.
        base: RoPE base (rope_theta).
        eps: RMSNorm epsilon (Qwen3: 1e-6).

    Returns:
        (q, k): new tensors of the input shapes and dtype.

    Raises:
        ValueError: q or k not 3-D, different N, d or dtype; an odd d; a weight
            that is not [d]; positions not [N].

    Example:
        >>> q, k = torch.tensor([[[1., 2., 3., 4.]]]), torch.tensor([[[2., 0., 0., 0.]]])
        >>> q2, k2 = qk_norm_rope(q, k, torch.ones(4), torch.ones(4), [1], 10000.0)
        >>> q2.round(decimals=4)          # [1, 2, 3, 4] / rms 2.7386, then rotated to position 1
        tensor([[[-0.7245,  0.7157,  0.8991,  1.4678]]])
    """
    # TODO(ch19.3): your code here (about 20 lines)
    raise NotImplementedError("ch19.3 qk_norm_rope: not implemented yet (about 20 lines)")
