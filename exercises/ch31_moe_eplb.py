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
    _check_router(router_logits, k)
    # TODO(ch31.1): your code here (about 6 lines)
    raise NotImplementedError("ch31.1 route_topk: not implemented yet (about 6 lines)")


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
    _check_routing(x, topk_ids, num_experts, num_ranks)
    # TODO(ch31.2): your code here (about 9 of the task's 15 lines, in 2 places)
    raise NotImplementedError("ch31.2 dispatch: not implemented yet (about 15 lines)")


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
    _check_outputs(per_rank_outputs, handle, topk_weights)
    # TODO(ch31.2): your code here (about 6 of the task's 15 lines, in 2 places)
    raise NotImplementedError("ch31.2 combine: not implemented yet (about 15 lines)")


def rebalance_experts(weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                      num_gpus: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek's EPLB: replicate hot experts and place the replicas on GPUs. Task ch31.3.

    For each layer, with loads w = weight[layer]. This follows `eplb.py` of
    DeepSeek's EPLB (github deepseek-ai/EPLB): everything is float32 there (the
    loads, load / count, and the running pack totals), and so it is here.

    **Policy.** Hierarchical when num_groups % num_nodes == 0; otherwise global,
    which is the same three steps with num_groups = num_nodes = 1.

    **Balanced packing** (used by steps 1 and 3) puts n items into m packs of
    exactly n/m items each: take the items in descending load and give each to
    the lightest pack that still has room (equal pack loads: lower pack index).
    When n/m = 1 it is the identity: item i goes to pack i. An item's rank in its
    pack is the order in which it arrived.

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

    **Equal loads.** Real loads are token counts, so they tie. Where EPLB
    decides, the course follows it: a tie of load / count in step 2 goes to
    the lower node-local index (EPLB's `max(dim=-1).indices`, like vLLM's
    `np.argmax`, returns the first maximum), and a tie of pack totals to the
    lower pack. Where it does not, any choice is accepted: EPLB sorts the
    items of steps 1 and 3 with torch's `sort(descending=True)`, which is not
    stable, so groups of equal load (step 1) and replicas of equal load
    (step 3, always the replicas of one expert and often experts whose counts
    coincide) may come in any order, each giving its own placement, and any
    order of an expert's slots in log2phy is accepted too. The reference takes
    them lower index first (a stable sort). DeepSeek's own `rebalance_experts`
    scores full marks. vLLM's port (`vllm/distributed/eplb/policy/default.py`)
    sorts with numpy's default, equally unstable sort and sums the pack totals
    in float64.

    Args:
        weight: [L, E] non-negative, finite load per (layer, logical expert).
        num_replicas: physical expert slots, ≥ E and a multiple of num_gpus.
        num_groups: expert groups (must divide E).
        num_nodes: nodes (must divide num_gpus).
        num_gpus: GPUs (ranks).

    Returns:
        (phy2log, log2phy, logcnt): int64 [L, num_replicas] logical expert in each
        slot; int64 [L, E, X] the slots of each expert's replicas (the reference
        lists them by replica rank, EPLB's order, but any order is accepted), −1
        padded, X the largest count over all layers; int64 [L, E] replica count
        of each expert.

    Raises:
        ValueError: weight not 2-D, negative or non-finite; a count that is not a
            positive int; num_groups not dividing E; num_nodes not dividing
            num_gpus; num_gpus not dividing num_replicas; num_replicas < E.

    Example:
        >>> phy2log, log2phy, logcnt = rebalance_experts(torch.tensor([[5.0, 1.0]]), 4, 1, 1, 2)
        >>> phy2log.tolist(), logcnt.tolist()
        ([[0, 0, 0, 1]], [[3, 1]])
    """
    _check_placement(weight, num_replicas, num_groups, num_nodes, num_gpus)
    # TODO(ch31.3): your code here (about 50 of the task's 53 lines, in 2 places)
    raise NotImplementedError("ch31.3 rebalance_experts: not implemented yet (about 53 lines)")


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
    _check_loads(load_per_rank)
    # TODO(ch31.3): your code here (about 3 of the task's 53 lines, in 2 places)
    raise NotImplementedError("ch31.3 balancedness: not implemented yet (about 53 lines)")


def record_expert_load(window: torch.Tensor, step: int, load_pass: torch.Tensor, phy2log: torch.Tensor,
                       num_experts: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """EPLB's load history: record one pass in a sliding window and sum it per logical expert. Task ch31.4.

    One pass's routing is noisy; EPLB rebalances from many. vLLM keeps, for
    every physical expert (slot), the tokens it processed in each of the last W
    forward passes: a ring buffer `expert_load_window` [W, L, P] (W is the
    `window_size` of its EPLB config) and a cursor `expert_load_window_step`.
    After a pass it writes the pass's counts into row `step`, over the oldest
    pass, and moves the cursor on, back to 0 after row W − 1. When it
    rebalances (every `step_interval` passes) it adds every slot's counts to the
    slot's logical expert (the replicas of an expert share its tokens) and sums
    the W rows: that [L, E] load is the `weight` of `rebalance_experts`.

    This follows `EplbState.step` and `EplbState.rearrange` in vLLM's
    `vllm/distributed/eplb/eplb_state.py`. Simplifications: vLLM writes the row
    in place (int32 counts), keeps only its own rank's slots and all-reduces the
    sums over the EP ranks, and leaves dummy passes out; the course returns a
    new int64 window, has one rank, and does the mapping at every call.

    Args:
        window: int64 [W, L, P], the counts of the last W passes, one row per
            pass (rows not written yet are 0). Not modified.
        step: the row this pass goes to, 0 ≤ step < W.
        load_pass: int64 [L, P], the tokens each slot processed in this pass.
        phy2log: int64 [L, P], the logical expert in each slot (the phy2log of
            `rebalance_experts`), ids in 0 … num_experts − 1.
        num_experts: E, the number of logical experts.

    Returns:
        (window, next_step, load): a new int64 [W, L, P] window, the old one with
        row `step` replaced by load_pass; the cursor (step + 1) mod W; and the
        int64 [L, E] load, load[l, e] = the sum over the new window's W rows and
        over the slots p with phy2log[l, p] = e of window[w, l, p].

    Example:
        >>> window = torch.zeros(2, 1, 3, dtype=torch.int64)
        >>> window, step, load = record_expert_load(window, 0, torch.tensor([[5, 1, 2]]), torch.tensor([[0, 1, 0]]), 2)
        >>> step, load.tolist()
        (1, [[7, 1]])
        >>> window, step, load = record_expert_load(window, step, torch.tensor([[4, 3, 0]]), torch.tensor([[0, 1, 0]]), 2)
        >>> step, load.tolist()
        (0, [[11, 4]])
    """
    _check_window(window, step, load_pass, phy2log, num_experts)
    # TODO(ch31.4): your code here (about 5 lines)
    raise NotImplementedError("ch31.4 record_expert_load: not implemented yet (about 5 lines)")


# -- provided: the input checks every task needs but none teaches (not part of the exercise) ----------------------

def _check_router(router_logits: torch.Tensor, k: int) -> None:
    """Provided: raise ValueError unless router_logits is a finite 2-D floating tensor [N, E] and k an int in 1 … E."""
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2 \
            or not router_logits.is_floating_point():
        raise ValueError("router_logits must be a 2-D floating tensor [num_tokens, num_experts]")
    num_experts = router_logits.shape[1]
    if type(k) is not int or not 1 <= k <= num_experts:
        raise ValueError(f"k must be an int in 1 … {num_experts} (the number of experts); got {k!r}")
    if not torch.isfinite(router_logits).all():
        raise ValueError("router_logits must be finite")


def _check_routing(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, num_ranks: int) -> None:
    """Provided: raise ValueError unless E and R are positive ints with R dividing E, x is 2-D [N, H] and topk_ids an
    int64 tensor [N, k] of expert ids in 0 … E − 1, distinct within each row."""
    for name, v in (("num_experts", num_experts), ("num_ranks", num_ranks)):
        if type(v) is not int or v < 1:
            raise ValueError(f"{name} must be a positive int; got {v!r}")
    if num_experts % num_ranks:
        raise ValueError(f"num_ranks={num_ranks} must divide num_experts={num_experts}: "
                         f"each rank owns a contiguous block of E/R experts")
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError("x must be a 2-D tensor [num_tokens, hidden]")
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 or topk_ids.dtype != torch.int64 \
            or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids must be an int64 tensor [num_tokens={x.shape[0]}, k]")
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        raise ValueError(f"expert ids must lie in 0 … {num_experts - 1}")
    if topk_ids.shape[1] > 1 and (topk_ids.sort(dim=1).values.diff(dim=1) == 0).any():
        raise ValueError("a token is routed to the same expert twice; its k experts must be distinct")


def _check_outputs(per_rank_outputs: list[torch.Tensor], handle: dict[str, torch.Tensor],
                   topk_weights: torch.Tensor) -> None:
    """Provided: raise ValueError unless there is one output [n_r, H] per rank with the handle's n_r rows and one H,
    topk_weights is 2-D [N, k], and the handle names each of its N·k (token, slot) pairs exactly once."""
    rows_per_rank = handle["rows_per_rank"].tolist()
    if not isinstance(per_rank_outputs, (list, tuple)) or len(per_rank_outputs) != len(rows_per_rank):
        raise ValueError(f"need one output tensor per rank ({len(rows_per_rank)} ranks)")
    widths = {y.shape[1] for y in per_rank_outputs if isinstance(y, torch.Tensor) and y.dim() == 2}
    if len(widths) != 1 or any(not isinstance(y, torch.Tensor) or y.dim() != 2 or y.shape[0] != n
                               for y, n in zip(per_rank_outputs, rows_per_rank)):
        raise ValueError(f"rank r's output must be [n_r, H] with n_r = {rows_per_rank} rows as dispatched, "
                         f"and one H for all ranks")
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.dim() != 2:
        raise ValueError("topk_weights must be a 2-D tensor [num_tokens, k]")
    num_tokens, k = topk_weights.shape
    src, slot = handle["src_token"], handle["topk_slot"]
    if src.numel() != num_tokens * k or (src.numel() and (
            int(src.min()) < 0 or int(src.max()) >= num_tokens or int(slot.min()) < 0 or int(slot.max()) >= k
            or torch.unique(src * k + slot).numel() != src.numel())):
        raise ValueError(f"the handle must name each of the {num_tokens}·{k} (token, slot) pairs of "
                         f"topk_weights {list(topk_weights.shape)} exactly once")


def _check_placement(weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int) -> None:
    """Provided: raise ValueError unless weight is a finite, non-negative 2-D tensor [L, E], the four counts are
    positive ints, num_groups divides E, num_nodes divides num_gpus, and num_replicas is a multiple of num_gpus and
    at least E."""
    for name, v in (("num_replicas", num_replicas), ("num_groups", num_groups), ("num_nodes", num_nodes),
                    ("num_gpus", num_gpus)):
        if type(v) is not int or v < 1:
            raise ValueError(f"{name} must be a positive int; got {v!r}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] == 0:
        raise ValueError("weight must be a 2-D tensor [num_layers, num_logical_experts]")
    if not torch.isfinite(weight.float()).all() or (weight < 0).any():
        raise ValueError("expert loads must be finite and non-negative")
    num_experts = weight.shape[1]
    if num_experts % num_groups:
        raise ValueError(f"num_groups={num_groups} must divide the {num_experts} experts")
    if num_gpus % num_nodes:
        raise ValueError(f"num_nodes={num_nodes} must divide num_gpus={num_gpus}")
    if num_replicas % num_gpus or num_replicas < num_experts:
        raise ValueError(f"num_replicas={num_replicas} must be a multiple of num_gpus={num_gpus} "
                         f"and at least the {num_experts} experts")


def _check_loads(load_per_rank: torch.Tensor) -> None:
    """Provided: raise ValueError unless load_per_rank is a finite, non-negative tensor [R] or [L, R] with R ≥ 1."""
    if not isinstance(load_per_rank, torch.Tensor) or load_per_rank.dim() not in (1, 2) \
            or load_per_rank.shape[-1] == 0 or load_per_rank.numel() == 0:
        raise ValueError("load_per_rank must be a tensor [R] or [L, R] with at least one rank")
    loads = load_per_rank.double()
    if not torch.isfinite(loads).all() or (loads < 0).any():
        raise ValueError("loads must be finite and non-negative")


def _check_window(window: torch.Tensor, step: int, load_pass: torch.Tensor, phy2log: torch.Tensor,
                  num_experts: int) -> None:
    """Provided: raise ValueError unless window is an int64 tensor [W, L, P] with W ≥ 1, step an int in 0 … W − 1,
    load_pass an int64 tensor [L, P] of counts ≥ 0, num_experts a positive int and phy2log an int64 tensor [L, P]
    of ids in 0 … num_experts − 1."""
    if not isinstance(window, torch.Tensor) or window.dtype != torch.int64 or window.dim() != 3 or window.shape[0] < 1:
        raise ValueError("window must be an int64 tensor [W, L, P] with W ≥ 1 rows, one per pass")
    W, L, P = window.shape
    if type(step) is not int or not 0 <= step < W:
        raise ValueError(f"step must be an int in 0 … {W - 1} (the window has {W} rows); got {step!r}")
    for name, t in (("load_pass", load_pass), ("phy2log", phy2log)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.shape != (L, P):
            raise ValueError(f"{name} must be an int64 tensor [L, P] = [{L}, {P}], like a row of the window")
    if (load_pass < 0).any():
        raise ValueError("a pass's token counts cannot be negative")
    if type(num_experts) is not int or num_experts < 1:
        raise ValueError(f"num_experts must be a positive int; got {num_experts!r}")
    if phy2log.numel() and (int(phy2log.min()) < 0 or int(phy2log.max()) >= num_experts):
        raise ValueError(f"phy2log must hold logical expert ids in 0 … {num_experts - 1}")
