"""ch31's models of EPLB's placement for the explanations of its checks (never shipped).

`grader.checks.ch31` asks for them through `grader.authoring.hidden_model` drivers, so a student release holds only
the answers for its fixed instances.
"""

from __future__ import annotations

import itertools
import math

import torch

ORDERS_LIMIT = 120
"""At most this many step-1 orders of one layer are tried (the checks' instances stay below it)."""


def step1_orders(ref, weight: torch.Tensor, args: tuple) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every placement (phy2log, logcnt) of each layer that EPLB can give when groups of equal load (step 1)
    arrive in another order: DeepSeek's `balanced_packing` sorts the group loads with torch's unstable sort, so any
    order of equal group loads is EPLB's. The reference takes them lower group first; each other order is the
    reference run on the groups relabelled in that order, then mapped back. The reference's own placement comes
    first; one layer with more than ORDERS_LIMIT orders keeps only it."""
    num_replicas, num_groups, num_nodes, num_gpus = args
    L, E = weight.shape
    out = []
    for layer in range(L):
        row = weight[layer : layer + 1]
        phy, _, cnt = ref.rebalance_experts(row, *args)
        found = [(phy[0], cnt[0])]
        if num_groups % num_nodes == 0 and num_groups // num_nodes > 1:
            gs = E // num_groups
            loads = row[0].float().view(num_groups, gs).sum(dim=1).tolist()
            classes = [list(g) for _, g in itertools.groupby(sorted(range(num_groups), key=lambda g: -loads[g]), key=lambda g: loads[g])]
            if math.prod(math.factorial(len(c)) for c in classes) <= ORDERS_LIMIT:
                for perms in itertools.product(*(itertools.permutations(c) for c in classes)):
                    order = [g for perm in perms for g in perm]  # group order[j] becomes group j
                    experts = torch.tensor([order[j] * gs + r for j in range(num_groups) for r in range(gs)])
                    p, _, c = ref.rebalance_experts(row[:, experts], *args)
                    candidate = (experts[p[0]], torch.empty_like(c[0]).scatter_(0, experts, c[0]))
                    if not any(torch.equal(candidate[0], f[0]) for f in found):
                        found.append(candidate)
        out.append(found)
    return out


def step2_ties_high(ref, weight: torch.Tensor, args: tuple) -> torch.Tensor:
    """logcnt [L, E] when step 2 gives a tie of load / count to the *higher* node-local index (the last maximum),
    everything else as the reference: the node of each expert from the reference's phy2log, its node-local order
    (groups in the order they arrived, heaviest first and the lower group on equal loads; experts in id order)."""
    num_replicas, num_groups, num_nodes, num_gpus = args
    if num_groups % num_nodes:
        num_groups = num_nodes = 1
    phy2log, _, _ = ref.rebalance_experts(weight, *args)
    L, E = weight.shape
    gs, per_node = E // num_groups, num_replicas // num_nodes
    out = torch.zeros(L, E, dtype=torch.int64)
    for layer in range(L):
        w = weight[layer].float()
        group_loads = w.view(num_groups, gs).sum(dim=1).tolist()
        for n in range(num_nodes):
            held = {e // gs for e in phy2log[layer, n * per_node : (n + 1) * per_node].tolist()}
            groups = sorted(held, key=lambda g: (-group_loads[g], g))
            experts = [g * gs + r for g in groups for r in range(gs)]
            loads, count = w[experts], torch.ones(len(experts), dtype=torch.int64)
            for _ in range(per_node - len(experts)):
                share = loads / count
                best = max(i for i in range(len(experts)) if share[i] == share.max())
                count[best] += 1
            out[layer, experts] = count
    return out
