# ch31 exercises: replace each TODO with your code, then run `course check ch31`.
"""跨 rank 的混合专家 · mixture of experts across ranks

A mixture-of-experts (MoE, 混合专家) layer replaces one big feed-forward network by
E smaller ones, the *experts*, and a *router*: a linear layer that gives every
token one logit per expert. The token is sent to the k experts with the largest
router probabilities (top-k routing), and the layer's output is the weighted sum of
those k experts' outputs. vLLM's `fused_topk` takes softmax over the experts, keeps
the k largest probabilities and, for models that ask for it, renormalises them to
sum to 1.

With expert parallelism (EP, 专家并行) the experts are spread over R ranks, so a
token's hidden vector has to *travel* to the ranks that hold its experts and the
results have to travel back. DeepEP names the two collectives **dispatch** and
**combine**. Dispatch permutes: every rank receives the rows routed to its
experts, grouped by expert so that one grouped GEMM can run over each expert's
contiguous segment. Combine undoes the permutation: it brings every expert output
back to the token it came from and reduces the top-k contributions. What makes
combine possible is the **handle** that dispatch returns: for every received row,
the token it came from and where it goes back to. Concatenating the ranks' outputs
in their physical order would give rows in the wrong order and some tokens twice
(非 MegaMoE 路径:handle 保存排列上下文,不是把专家输出按物理顺序拼接). DeepEP's
normal mode sends a token once per rank and leaves the weighting to the receiver;
its low-latency mode (and V2's expanded layout) keeps one row per (token, expert)
and applies the top-k weights when the rows come home. The course uses that
expanded layout. DeepGEMM's Mega MoE fuses dispatch, both GEMMs and combine into
one kernel; the data still makes the same round trip.

Routing is skewed: some experts are hot, so the rank that holds them is the
slowest, and every other rank waits for it at the next collective. The average
load per rank hides this (平均负载掩盖最慢 rank); what sets the step time is the
maximum. vLLM logs **balancedness** = mean load / max load (1.0 is perfect).
DeepSeek's EPLB (Expert Parallelism Load Balancer) raises it by giving hot experts
*redundant replicas* and placing the replicas so that every GPU carries about the
same load. Its hierarchical policy (used when the expert groups divide evenly over
the nodes) packs groups onto nodes, replicates the hottest experts inside each
node, then packs the replicas onto the node's GPUs; otherwise the same steps run
once over the whole cluster (the global policy). The loads come from history: vLLM
sums the per-expert token counts of a sliding window of steps and rebalances every
few thousand steps.

路由 top-k → dispatch 按专家分组 → 专家计算 → combine 按 handle 回到 token 顺序并加权求和;
EPLB 用冗余副本与装箱把最慢 rank 的负载降下来。
"""

import numpy as np
import torch


def route_topk(router_logits: torch.Tensor, k: int,
               renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k expert routing: softmax over experts, the k most probable ones. Task ch31.1.

    For each token (row), p = softmax(router_logits[row]) over the E experts, in
    float32. The k experts with the largest p are chosen, in descending order of
    p; equal probabilities go to the **lower expert id first** (a stable
    descending sort). Their weights are their probabilities, divided by the sum of
    the k chosen probabilities when `renormalize` (so each row's weights sum to 1).
    This is vLLM's `fused_topk` (softmax scoring); vLLM returns int32 ids, the
    course int64 like every index tensor.

    Args:
        router_logits: [N, E] floating tensor (any float dtype), finite.
        k: experts per token, 1 ≤ k ≤ E.
        renormalize: rescale the k weights of each token to sum to 1.

    Returns:
        (topk_ids, topk_weights): int64 [N, k] expert ids and float32 [N, k]
        weights, column j holding each token's j-th most probable expert.

    Raises:
        ValueError: logits not a 2-D floating tensor, non-finite logits, or k
            outside 1 … E.

    Example:
        >>> ids, w = route_topk(torch.tensor([[0.0, 2.0, 2.0, 1.0]]), 2)
        >>> ids.tolist(), [round(v, 3) for v in w[0].tolist()]
        ([[1, 2]], [0.5, 0.5])
    """
    # TODO(ch31.1): your code here (about 14 lines)
    raise NotImplementedError("ch31.1 route_topk: not implemented yet (about 14 lines)")


def dispatch(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
             num_ranks: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Send each token's hidden row to the ranks of its experts, grouped by expert. Task ch31.2.

    Experts are placed contiguously: rank r owns experts r·E/R … (r+1)·E/R − 1.
    Every (token, top-k slot) pair becomes one row on its expert's rank. Rank r's
    rows are grouped by expert in ascending expert id, and within one expert in
    ascending token order, so each expert reads one contiguous segment (the
    layout a grouped GEMM wants).

    The handle records, for every row, where it came from. Its tensors list the
    rows of all ranks one after another (rank 0's rows first, then rank 1's, …),
    i.e. sorted by expert and then token:

    - `src_token` int64 [N·k]: the token the row is a copy of;
    - `topk_slot` int64 [N·k]: which of the token's k choices it is;
    - `expert` int64 [N·k]: the (global) expert id it is routed to;
    - `rows_per_rank` int64 [R]: how many rows each rank received;
    - `tokens_per_expert` int64 [E]: how many rows each expert received.

    Simplification: DeepEP's normal dispatch sends a token once per *rank*
    (de-duplicated) and keeps its bookkeeping in prefix-sum matrices; the course
    sends one row per (token, expert), like DeepEP's low-latency mode and V2's
    expanded layout, and keeps the handle as plain per-row tensors.

    Args:
        x: [N, H] hidden rows of the tokens (any dtype).
        topk_ids: int64 [N, k] expert ids from route_topk, distinct within a row.
        num_experts: E, the number of experts (> 0).
        num_ranks: R, the number of ranks (> 0); must divide E.

    Returns:
        (per_rank_inputs, handle): a list of R tensors [n_r, H] (x's dtype; n_r
        may be 0) and the handle described above.

    Raises:
        ValueError: R not dividing E, x not 2-D, topk_ids not a 2-D int64 tensor
            with one row per token, an expert id outside 0 … E − 1, or a token
            routed to the same expert twice.

    Example:
        >>> x = torch.tensor([[1.0], [2.0]])
        >>> inputs, handle = dispatch(x, torch.tensor([[1, 0], [0, 1]]), 2, 2)
        >>> [r.flatten().tolist() for r in inputs], handle["src_token"].tolist()
        ([[1.0, 2.0], [1.0, 2.0]], [0, 1, 0, 1])
    """
    # TODO(ch31.2): your code here (about 24 of the task's 45 lines, in 2 places)
    raise NotImplementedError("ch31.2 dispatch: not implemented yet (about 45 lines)")


def combine(per_rank_outputs: list[torch.Tensor], handle: dict[str, torch.Tensor],
            topk_weights: torch.Tensor) -> torch.Tensor:
    """Bring every expert output home and reduce the top-k contributions. Task ch31.2.

    Row i of the concatenated outputs (rank 0's rows first) belongs to token
    handle["src_token"][i], slot handle["topk_slot"][i]; combine returns, in token
    order,

        out[t] = Σ_j topk_weights[t, j] · output of (t, j)

    computed in float32 and returned in the outputs' dtype. With identity experts
    (outputs = dispatched inputs) the round trip gives x · Σ_j topk_weights[t, j].

    Simplification: DeepEP's normal combine receives one row per (token, rank)
    and sums them *without* weights (the receiving rank has already weighted and
    reduced its local experts); the course applies all weights here, as DeepEP's
    low-latency combine does at the source rank.

    Args:
        per_rank_outputs: R tensors [n_r, H], the experts' outputs for the rows
            dispatch sent to rank r, in the same order.
        handle: the handle dispatch returned.
        topk_weights: [N, k] routing weights.

    Returns:
        [N, H] tensor in token order, the dtype of the outputs.

    Raises:
        ValueError: a number of ranks or of rows per rank other than the
            handle's, outputs of different widths, weights not [N, k] for the
            handle's tokens, or a handle that does not name every (token, slot)
            exactly once.

    Example:
        >>> x = torch.tensor([[1.0], [2.0]]); w = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
        >>> inputs, handle = dispatch(x, torch.tensor([[1, 0], [0, 1]]), 2, 2)
        >>> combine(inputs, handle, w).flatten().tolist()
        [1.0, 2.0]
    """
    # TODO(ch31.2): your code here (about 21 of the task's 45 lines, in 2 places)
    raise NotImplementedError("ch31.2 combine: not implemented yet (about 45 lines)")


def rebalance_experts(weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                      num_gpus: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek's EPLB: replicate hot experts and place the replicas on GPUs. Task ch31.3.

    For each layer, with loads w = weight[layer]. Everything is float32, as in
    EPLB: the loads, load / count, and the running pack totals (the greedy
    choices compare these sums, and float64 sums could break a near-tie the
    other way).

    **Policy.** Hierarchical when num_groups % num_nodes == 0; otherwise global,
    which is the same three steps with num_groups = num_nodes = 1.

    **Balanced packing** (used by steps 1 and 3) puts n items into m packs of
    exactly n/m items each: take the items in descending load (equal loads: lower
    index first) and give each to the lightest pack that still has room (equal
    pack loads: lower pack index). When n/m = 1 it is the identity: item i goes to
    pack i. An item's rank in its pack is the order in which it arrived.

    1. **Groups to nodes.** Experts form num_groups groups of E/num_groups
       consecutive ids; a group's load is the sum of its experts' loads. Pack the
       groups onto the nodes. Node j's *node-local* experts are its groups in the
       order they arrived, each group's experts in id order.
    2. **Replicate within each node.** Node j has num_replicas/num_nodes slots for
       its E/num_nodes experts. Every expert starts with one replica; each spare
       slot goes to the expert with the largest load / replica count (equal
       values: the lower node-local index). A replica carries load / count.
       Physical replicas are numbered: the node-local experts in order, then the
       added replicas in the order they were added.
    3. **Replicas to GPUs.** Pack each node's replicas (by their loads) onto its
       num_gpus/num_nodes GPUs, num_replicas/num_gpus per GPU. Global slot
       node·(num_replicas/num_nodes) + gpu_in_node·(num_replicas/num_gpus) +
       rank_in_pack holds the replica; slot s lives on GPU s // (num_replicas/num_gpus).

    Args:
        weight: [L, E] non-negative, finite load per (layer, logical expert).
        num_replicas: physical expert slots, ≥ E and a multiple of num_gpus.
        num_groups: expert groups (must divide E).
        num_nodes: nodes (must divide num_gpus).
        num_gpus: GPUs (ranks).

    Returns:
        (phy2log, log2phy, logcnt): int64 [L, num_replicas] logical expert in each
        slot; int64 [L, E, X] the slots of each expert's replicas by replica rank
        (rank 0 first, then in the order they were added), −1 padded, X the
        largest count over all layers; int64 [L, E] replica count of each expert.

    Raises:
        ValueError: weight not 2-D, negative or non-finite; a count that is not a
            positive int; num_groups not dividing E; num_nodes not dividing
            num_gpus; num_gpus not dividing num_replicas; num_replicas < E.

    Example:
        >>> phy2log, log2phy, logcnt = rebalance_experts(torch.tensor([[5.0, 1.0]]), 4, 1, 1, 2)
        >>> phy2log.tolist(), logcnt.tolist()
        ([[0, 0, 0, 1]], [[3, 1]])
    """
    # TODO(ch31.3): your code here (about 65 of the task's 73 lines, in 2 places)
    raise NotImplementedError("ch31.3 rebalance_experts: not implemented yet (about 73 lines)")


def balancedness(load_per_rank: torch.Tensor) -> float:
    """Mean load over max load across ranks: 1.0 is perfectly balanced. Task ch31.3.

    For one layer, [R] loads: mean / max. For [L, R] (one row per MoE layer), as
    vLLM logs it: Σ_layers mean / Σ_layers max. The slowest rank sets the step time,
    so this is the fraction of that time the average rank spends working. When
    every load is 0 the result is 0.0 (vLLM's convention). vLLM stores the
    per-rank loads as [R, L]; the course puts layers first, like `weight`.

    Args:
        load_per_rank: [R] or [L, R] non-negative, finite loads (tokens per rank).

    Returns:
        A Python float in [0, 1].

    Raises:
        ValueError: not a 1-D or 2-D tensor with at least one rank, or a
            negative or non-finite load.

    Example:
        >>> balancedness(torch.tensor([100.0, 60.0, 90.0, 50.0]))
        0.75
    """
    # TODO(ch31.3): your code here (about 8 of the task's 73 lines, in 2 places)
    raise NotImplementedError("ch31.3 balancedness: not implemented yet (about 73 lines)")
