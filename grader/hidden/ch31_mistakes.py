"""ch31 · mixture of experts across ranks: the common mistakes, each with the hint that names it and the edit of the
reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

MISTAKES = [
    # -- 31.1 route_topk
    mistake(
        "ascending_order",
        "ch31.1",
        "list the experts from the most probable to the least",
        (
            "ids = probs.sort(dim=-1, descending=True, stable=True).indices[:, :k]",
            "ids = probs.sort(dim=-1, descending=True, stable=True).indices[:, :k].flip(-1)",
        ),
    ),
    mistake(
        "ties_high",
        "ch31.1",
        "equal probabilities go to the lower expert id first (a stable descending sort)",
        (
            "ids = probs.sort(dim=-1, descending=True, stable=True).indices[:, :k]",
            "ids = (probs.shape[1] - 1 - probs.flip(-1).sort(dim=-1, descending=True, stable=True).indices)[:, :k]",
        ),
    ),
    mistake(
        "no_renormalize",
        "ch31.1",
        "renormalize: divide the k weights by their sum so that they add up to 1",
        ("    if renormalize:\n        weights = weights / weights.sum(dim=-1, keepdim=True)\n", ""),
    ),
    mistake(
        "always_renormalize",
        "ch31.1",
        "with renormalize=False the weights stay the softmax probabilities",
        (
            "    if renormalize:\n        weights = weights / weights.sum(dim=-1, keepdim=True)\n",
            "    weights = weights / weights.sum(dim=-1, keepdim=True)\n",
        ),
    ),
    mistake(
        "logit_weights",
        "ch31.1",
        "the weights are softmax probabilities, not logits",
        ("weights = probs.gather(1, ids)", "weights = router_logits.float().gather(1, ids)"),
    ),
    # -- 31.2 dispatch and combine
    mistake(
        "dedup_per_rank",
        "ch31.2",
        "the course sends a token once per expert, not once per rank (DeepEP's normal mode de-duplicates)",
        (
            '    rows = x[handle["src_token"]]\n',
            "    pairs = sorted({(e // (num_experts // num_ranks), t // k) for t, e in enumerate(flat.tolist())})\n"
            '    handle["src_token"] = torch.tensor([t for _, t in pairs], dtype=torch.int64)\n'
            '    handle["rows_per_rank"] = rows_per_rank = torch.bincount(\n'
            "        torch.tensor([r for r, _ in pairs], dtype=torch.int64), minlength=num_ranks)\n"
            '    rows = x[handle["src_token"]]\n',
        ),
    ),
    mistake(
        "local_expert_ids",
        "ch31.2",
        "the handle keeps global expert ids (rank r's experts are r·E/R …), not ids local to the rank",
        ('"expert": flat[order],', '"expert": flat[order] % (num_experts // num_ranks),'),
    ),
    mistake(
        "by_token",
        "ch31.2",
        "group a rank's rows by expert first (ascending), then by token: each expert reads one segment",
        (
            "order = flat.sort(stable=True).indices                  # by expert, then by token (and slot)",
            "order = flat.sort(stable=True).indices.sort().values",
        ),
    ),
    mistake(
        "concatenated",
        "ch31.2",
        "combine returns the tokens in their order; concatenating the ranks' rows gives one row per (token, expert) in the wrong order",
        (
            "    y = torch.cat(list(per_rank_outputs))\n    gathered",
            "    return torch.cat(list(per_rank_outputs))\n    y = torch.cat(list(per_rank_outputs))\n    gathered",
        ),
    ),
    mistake(
        "unweighted",
        "ch31.2",
        "multiply each expert output by its top-k weight before summing",
        ("return (gathered * topk_weights.float()[:, :, None]).sum(dim=1).to(y.dtype)", "return gathered.sum(dim=1).to(y.dtype)"),
    ),
    mistake(
        "weights_in_row_order",
        "ch31.2",
        "the weight of row i is topk_weights[src_token[i], topk_slot[i]], not the i-th weight in row order",
        (
            "return (gathered * topk_weights.float()[:, :, None]).sum(dim=1).to(y.dtype)",
            "return torch.zeros(num_tokens, y.shape[1]).index_add_(\n"
            "        0, src, y.float() * topk_weights.float().reshape(-1)[:, None]).to(y.dtype)",
        ),
    ),
    # -- 31.3 rebalance_experts and balancedness
    mistake(
        "always_global",
        "ch31.3",
        "{groups} groups divide over {nodes} nodes: use the hierarchical policy (replicate within nodes)",
        ("    if num_groups % num_nodes:                      # global policy", "    if True:                      # global policy"),
    ),
    mistake(
        "raw_load",
        "ch31.3",
        "each spare slot goes to the expert with the largest load / current replica count, not the largest load",
        ("best = int((loads / count).argmax())", "best = int(loads.argmax())"),
    ),
    mistake(
        "step2_tie_high",
        "ch31.3",
        "a tie of load / count goes to the lower node-local index: EPLB's max(dim=-1) (and vLLM's np.argmax) returns the first maximum",
        ("best = int((loads / count).argmax())", "best = len(experts) - 1 - int((loads / count).flip(0).argmax())"),
    ),
    mistake(
        "round_robin",
        "ch31.3",
        "each group goes to the lightest node that still has room (equal loads: the lower node)",
        (
            "            p = min((p for p in range(num_packs) if counts[p] < per_pack), key=lambda p: totals[p])",
            "            p = next(p for p in sorted(range(num_packs), key=lambda p: counts[p])\n"
            "                     if counts[p] < per_pack)",
        ),
    ),
    mistake(
        "node_identity",
        "ch31.3",
        "with one group per node balanced packing keeps the identity: group n on node n",
        ("        if per_pack == 1:\n            return [(i, 0) for i in range(len(loads))]\n", ""),
    ),
    mistake(
        "packing_order",
        "ch31.3",
        "the same loads on other GPUs: balanced packing gives each item to the lightest pack with room, "
        "lower pack index on ties (and keeps the identity when a pack holds one item)",
        ("            where[i] = (p, counts[p])", "            where[i] = (num_packs - 1 - p, counts[p])"),
    ),
    mistake(
        "max_over_mean",
        "ch31.3",
        "balancedness is mean / max (at most 1), not max / mean",
        (
            "return float(loads.mean(dim=1).sum()) / top if top > 0 else 0.0",
            "return top / float(loads.mean(dim=1).sum()) if top > 0 else 0.0",
        ),
    ),
    mistake(
        "ratio_mean",
        "ch31.3",
        "over layers vLLM divides the sums, Σ mean / Σ max, not the mean of per-layer ratios",
        (
            "return float(loads.mean(dim=1).sum()) / top if top > 0 else 0.0",
            "return float((loads.mean(dim=1) / loads.max(dim=1).values).mean()) if top > 0 else 0.0",
        ),
    ),
    # -- 31.4 record_expert_load
    mistake(
        "last_step_only",
        "ch31.4",
        "EPLB rebalances from history: sum the counts of all W passes in the window, not this pass alone",
        ("    per_slot = window.sum(dim=0)                            # [L, P]: the W passes added up", "    per_slot = load_pass.clone()"),
    ),
    mistake(
        "window_mean",
        "ch31.4",
        "add the W passes up (the sum over the window's first axis, in whole tokens), do not average them",
        (
            "    per_slot = window.sum(dim=0)                            # [L, P]: the W passes added up",
            "    per_slot = window.sum(dim=0) // window.shape[0]",
        ),
    ),
    mistake(
        "physical_loads",
        "ch31.4",
        "add each slot's count to its logical expert through phy2log: the replicas of an expert share its "
        "tokens, and rebalance_experts takes one load per logical expert",
        ("    return window, (step + 1) % window.shape[0], load", "    return window, (step + 1) % window.shape[0], per_slot"),
    ),
    mistake(
        "not_wrapped",
        "ch31.4",
        "the window is a ring buffer: after its last row the cursor goes back to row 0",
        ("(step + 1) % window.shape[0], load", "step + 1, load"),
    ),
    mistake(
        "shifted_window",
        "ch31.4",
        "write this pass into row `step` (the oldest pass) and leave the other rows where they are: the cursor, "
        "not a shift, marks the oldest row",
        (
            "    window[step] = load_pass                                # over the oldest pass",
            "    window = torch.cat([window[1:], load_pass[None]])",
        ),
    ),
]
