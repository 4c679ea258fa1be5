"""Qwen3-MoE's layers of experts in the engine: ch31's routing, dispatch and combine over simulated ranks, EPLB in the loop.

One layer of experts, for the step's N tokens (all ch31's graded functions but the experts themselves):

1. router logits [N, E] with ch15's `linear`; ch31's `route_topk` keeps each token's k most probable
   experts (softmax over the experts, renormalised when the config's `norm_topk_prob`: Qwen3-MoE's rule);
2. each (token, expert) choice picks one *physical* replica of its expert (below), and ch31's `dispatch`
   sends the token's row to the rank that holds it, grouped by slot (dispatch's "experts" are the P
   physical slots, placed contiguously on the ranks as its contract says);
3. every rank runs each of its slots' expert (ch20's `swiglu_mlp`) on that slot's rows;
4. ch31's `combine` brings the outputs home and sums the k of each token, weighted by the routing weights.

Expert parallelism is simulated: R ranks (`ExpertParallelSettings.num_ranks`) in one process. The P
physical slots are placed as EPLB places them, slot s on rank s // (P / R); `phy2log` names the
logical expert in each slot. The first placement is vLLM's (`EplbState.build_initial_global_physical_to_logical_map`
in vllm/distributed/eplb/eplb_state.py): the E experts in order, then the redundant slots holding
experts 0, 1, … again (with no redundant slot: the identity, one replica per expert).

A choice of expert e at flat position i of the step's [N, k] top-k ids takes e's replica i mod
(e's replica count), as vLLM does (`eplb_map_to_physical_and_record` in
vllm/model_executor/layers/fused_moe/router/base_router.py): deterministic, and it spreads an expert's
tokens evenly over its replicas. Replicas hold the same weights, so the choice never changes the result.

EPLB in the loop: every step's tokens per slot go into ch31's `record_expert_load` sliding window; every
`rebalance_interval` steps ch31's `rebalance_experts` (DeepSeek's EPLB, global policy: Qwen3-MoE has no
expert groups) recomputes the placement from the window's load, and ch31's `balancedness` of the ranks'
loads is measured before (the window as it ran) and after (the same load on the new placement, each
expert's load split evenly over its replicas, EPLB's own assumption). Simplifications: vLLM moves the
experts' weights between GPUs when it rearranges; here every rank can read every expert, so only the map
changes. The course also clears the window after a rearrangement (its rows count the slots of the old
placement, which `record_expert_load` would read with the new map).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from engine.model import ModelConfig, ModelError, MoeWeights
from engine.words import tr

Call = Callable[..., Any]
"""`ModelRunner.call`: (stage, part name, *args, shapes=…) → the part's result, traced."""


@dataclass(frozen=True, slots=True)
class ExpertParallelSettings:
    """How the experts are spread over simulated ranks and how often EPLB rearranges them."""

    num_ranks: int = 4
    """R, the expert-parallel ranks."""
    redundant_experts: int | None = None
    """Physical slots beyond the E experts; None: E / 2, rounded up so that E + redundant is a multiple of R."""
    rebalance_interval: int = 8
    """Steps between two EPLB rearrangements (vLLM's `step_interval`); 0: never."""
    window_size: int | None = None
    """Steps in the load window (vLLM's `window_size`); None: rebalance_interval (every step since the last one)."""

    def __post_init__(self) -> None:
        if type(self.num_ranks) is not int or self.num_ranks < 1:
            raise ValueError(f"num_ranks must be a positive int; got {self.num_ranks!r}")
        if self.redundant_experts is not None and (type(self.redundant_experts) is not int or self.redundant_experts < 0):
            raise ValueError(f"redundant_experts must be an int ≥ 0; got {self.redundant_experts!r}")
        if type(self.rebalance_interval) is not int or self.rebalance_interval < 0:
            raise ValueError(f"rebalance_interval must be an int ≥ 0 (0: never); got {self.rebalance_interval!r}")
        if self.window_size is not None and (type(self.window_size) is not int or self.window_size < 1):
            raise ValueError(f"window_size must be a positive int; got {self.window_size!r}")

    def physical_experts(self, num_experts: int) -> int:
        """P, the physical slots for `num_experts` logical experts: a multiple of num_ranks, at least num_experts.

        Raises:
            ModelError: an explicit redundant_experts that leaves E + redundant not a multiple of num_ranks.
        """
        R = self.num_ranks
        if self.redundant_experts is None:
            return -(-(num_experts + -(-num_experts // 2)) // R) * R
        P = num_experts + self.redundant_experts
        if P % R:
            raise ModelError(f"{num_experts} experts + {self.redundant_experts} redundant = {P} slots, not a multiple of the {R} ranks")
        return P


class ExpertParallel:
    """One run's expert placement and load history: the state EPLB keeps between steps (vLLM's `EplbState`)."""

    def __init__(self, config: ModelConfig, settings: ExpertParallelSettings, call: Call) -> None:
        self.config, self.settings, self.call = config, settings, call
        self.layers = [i for i in range(config.num_hidden_layers) if config.is_moe_layer(i)]
        self.row = {layer: j for j, layer in enumerate(self.layers)}
        E, L = config.num_experts, len(self.layers)
        self.num_ranks, self.num_slots = settings.num_ranks, settings.physical_experts(E)
        initial = list(range(E)) + [i % E for i in range(self.num_slots - E)]
        self.initial_phy2log = torch.tensor([initial] * L, dtype=torch.int64)
        self._place(self.initial_phy2log)
        window = settings.window_size or settings.rebalance_interval or 1
        self.window = torch.zeros(window, L, self.num_slots, dtype=torch.int64)
        self.cursor = 0
        self.load_pass = torch.zeros(L, self.num_slots, dtype=torch.int64)
        self.rank_load = torch.zeros(L, self.num_ranks, dtype=torch.int64)
        """Tokens each rank computed in each layer, over the whole run."""
        self.steps, self.rebalances, self.slots_moved = 0, 0, 0
        self.balancedness_before: float | None = None
        self.balancedness_after: float | None = None

    def _place(self, phy2log: torch.Tensor, log2phy: torch.Tensor | None = None, logcnt: torch.Tensor | None = None) -> None:
        """Adopt a placement; log2phy and logcnt are derived from phy2log when not given (slots in ascending order)."""
        E = self.config.num_experts
        self.phy2log = phy2log
        if logcnt is None or log2phy is None:
            logcnt = torch.stack([torch.bincount(row, minlength=E) for row in phy2log])
            log2phy = torch.full((*logcnt.shape, int(logcnt.max())), -1, dtype=torch.int64)
            for j, row in enumerate(phy2log.tolist()):
                seen = [0] * E
                for slot, e in enumerate(row):
                    log2phy[j, e, seen[e]] = slot
                    seen[e] += 1
        self.log2phy, self.logcnt = log2phy, logcnt

    def physical_ids(self, layer: int, topk_ids: torch.Tensor) -> torch.Tensor:
        """The slot of each (token, choice): replica (flat position mod replica count) of the chosen expert."""
        j = self.row[layer]
        positions = torch.arange(topk_ids.numel()).reshape(topk_ids.shape)
        replica = positions % self.logcnt[j][topk_ids]
        return self.log2phy[j][topk_ids].gather(-1, replica[..., None]).squeeze(-1)

    def forward(self, layer: int, moe: MoeWeights, x: torch.Tensor) -> torch.Tensor:
        """The layer's mixture of experts on the step's rows x [N, H]: route, dispatch, experts, combine."""
        c, call, R, P = self.config, self.call, self.num_ranks, self.num_slots
        router_logits = call("router logits", "linear", x, moe.router)
        topk_ids, topk_weights = call(
            "route top-k",
            "route_topk",
            router_logits,
            c.num_experts_per_tok,
            c.norm_topk_prob,
            shapes=lambda out: tr(
                "logits {logits} → experts {experts} · weights {weights}",
                logits=_shape(router_logits),
                experts=_shape(out[0]),
                weights=_shape(out[1]),
            ),
        )
        slots = self.physical_ids(layer, topk_ids)
        per_rank, handle = call(
            "dispatch to ranks",
            "dispatch",
            x,
            slots,
            P,
            R,
            shapes=lambda out: tr(
                "{x} × top-{k} → {ranks} ranks of {rows} rows", x=_shape(x), k=c.num_experts_per_tok, ranks=R, rows=handle_rows(out[1])
            ),
        )
        counts, slot_of_row, outputs = handle["tokens_per_expert"], handle["expert"], []
        first = 0
        for rank_rows in per_rank:
            rows_out, start = [], 0
            for slot in slot_of_row[first : first + rank_rows.shape[0]].unique_consecutive().tolist():
                n, e = int(counts[slot]), int(self.phy2log[self.row[layer], slot])
                rows_out.append(call("expert (SwiGLU)", "swiglu_mlp", rank_rows[start : start + n], moe.gate_up[e], moe.down[e]))
                start += n
            first += rank_rows.shape[0]
            outputs.append(torch.cat(rows_out) if rows_out else rank_rows.new_zeros(rank_rows.shape))
        self.load_pass[self.row[layer]] = counts
        out = call(
            "combine to tokens",
            "combine",
            outputs,
            handle,
            topk_weights,
            shapes=lambda y: tr("{ranks} ranks of {rows} rows → {out}", ranks=R, rows=handle_rows(handle), out=_shape(y)),
        )
        if layer == self.layers[-1]:
            self.end_step()
        return out

    def end_step(self) -> None:
        """After a step's last layer of experts: record its load in the window; rearrange when it is time."""
        E, L, R, P = self.config.num_experts, len(self.layers), self.num_ranks, self.num_slots
        self.window, self.cursor, load = self.call(
            "EPLB load window",
            "record_expert_load",
            self.window,
            self.cursor,
            self.load_pass,
            self.phy2log,
            E,
            shapes=lambda out: tr(
                "window {window} · pass {load_pass} → load {load}",
                window=_shape(out[0]),
                load_pass=_shape(self.load_pass),
                load=_shape(out[2]),
            ),
        )
        self.rank_load += self.load_pass.view(L, R, P // R).sum(-1)
        self.load_pass = torch.zeros_like(self.load_pass)
        self.steps += 1
        interval = self.settings.rebalance_interval
        if interval and self.steps % interval == 0 and int(load.sum()) > 0:
            self.rebalance(load)

    def rebalance(self, load: torch.Tensor) -> None:
        """EPLB: a new placement from the window's load [L, E]; balancedness before and after."""
        L, R, P = len(self.layers), self.num_ranks, self.num_slots
        measured = self.window.sum(0).view(L, R, P // R).sum(-1)
        ran = lambda b: tr("rank loads {loads} as they ran → {balancedness:.3f}", loads=_shape(measured), balancedness=b)
        before = self.call("EPLB balancedness", "balancedness", measured, shapes=ran)
        phy2log, log2phy, logcnt = self.call(
            "EPLB rebalance",
            "rebalance_experts",
            load.float(),
            P,
            1,
            1,
            R,
            shapes=lambda out: tr("load {load} → phy2log {phy2log} on {ranks} ranks", load=_shape(load), phy2log=_shape(out[0]), ranks=R),
        )
        expected = (load.double() / logcnt).gather(1, phy2log).view(L, R, P // R).sum(-1)
        after = self.call("EPLB balancedness", "balancedness", expected)
        self.slots_moved += int((phy2log != self.phy2log).sum())
        self._place(phy2log, log2phy, logcnt)
        self.window = torch.zeros_like(self.window)
        self.cursor = 0
        self.rebalances += 1
        self.balancedness_before, self.balancedness_after = float(before), float(after)

    def metrics(self) -> dict[str, Any]:
        """The run's expert-parallel numbers: ranks and slots, rearrangements, balancedness measured over the run and
        that of the last rearrangement (before it and after it), the slots whose expert a rearrangement changed.
        Named numbers only (what a sandboxed run may send back)."""
        return {
            "moe_ep_ranks": self.num_ranks,
            "moe_physical_experts": self.num_slots,
            "moe_balancedness": float(self.call("EPLB balancedness", "balancedness", self.rank_load)),
            "eplb_rebalances": self.rebalances,
            "moe_balancedness_before": self.balancedness_before,
            "moe_balancedness_after": self.balancedness_after,
            "eplb_slots_moved": self.slots_moved,
        }


def handle_rows(handle: dict[str, torch.Tensor]) -> str:
    """The rows each rank received, as a short list."""
    return str(handle["rows_per_rank"].tolist())


def _shape(x: Any) -> str:
    return f"[{', '.join(map(str, x.shape))}]" if isinstance(x, torch.Tensor) else type(x).__name__
