"""ch24's allocator interface over ch25's BlockManager and its prefix cache.

The two chapters met only here. ch24's Scheduler was written against a plain allocator
without a prefix cache; `PagedBlocks` gives it ch25's `BlockManager` behind the same
interface. Its budget therefore counts every token of a prompt, cached or not (nano-vllm
counts only the uncached ones), and the runner skips the tokens the prefix cache already
holds.
"""

from __future__ import annotations

from typing import Any

from engine.errors import EngineError
from engine.words import tr


class PagedBlocks:
    """ch24's allocator interface (what its Scheduler calls) over ch25's BlockManager and its prefix cache.

    The two chapters have a Sequence class each; every scheduler sequence gets a block-manager twin that
    shares its token list and block table, synchronised before every call.
    """

    def __init__(self, manager: Any, twin_class: type, num_blocks: int, block_size: int) -> None:
        self.manager, self.twin_class = manager, twin_class
        self.num_blocks, self.block_size = num_blocks, block_size
        self.cached_tokens: dict[int, int] = {}
        """seq_id → tokens the prefix cache served when the sequence was last admitted."""
        self.hits: list[int] = []
        """The hit (in tokens) of every admission that had one."""
        self._twins: dict[int, Any] = {}

    def _twin(self, seq: Any) -> Any:
        twin = self._twins.get(seq.seq_id)
        if twin is None:
            twin = self._twins[seq.seq_id] = self.twin_class(list(seq.token_ids), self.block_size)
        twin.token_ids, twin.num_tokens, twin.block_table = seq.token_ids, len(seq.token_ids), seq.block_table
        return twin

    def _sync_back(self, seq: Any, twin: Any) -> None:
        if twin.block_table is not seq.block_table:  # a manager that rebinds the table instead of editing it
            seq.block_table[:] = twin.block_table
            twin.block_table = seq.block_table

    @property
    def free_block_ids(self) -> Any:
        return self.manager.free_block_ids

    @property
    def num_free_blocks(self) -> int:
        return len(self.manager.free_block_ids)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, seq: Any) -> bool:
        return self.manager.can_allocate(self._twin(seq)) >= 0

    def allocate(self, seq: Any) -> None:
        twin = self._twin(seq)
        num_cached_blocks = self.manager.can_allocate(twin)
        if num_cached_blocks < 0:
            raise EngineError(tr("ch24's Scheduler allocated a sequence that ch25's can_allocate says does not fit"))
        self.manager.allocate(twin, num_cached_blocks)
        self._sync_back(seq, twin)
        self.cached_tokens[seq.seq_id] = num_cached_blocks * self.block_size
        if num_cached_blocks:
            self.hits.append(num_cached_blocks * self.block_size)

    def deallocate(self, seq: Any) -> None:
        twin = self._twin(seq)
        self.manager.deallocate(twin)
        self._sync_back(seq, twin)
        self.cached_tokens.pop(seq.seq_id, None)

    def can_append(self, seq: Any) -> bool:
        return bool(self.manager.can_append(self._twin(seq)))

    def may_append(self, seq: Any) -> None:
        twin = self._twin(seq)
        self.manager.may_append(twin)
        self._sync_back(seq, twin)

    def hash_blocks(self, seq: Any) -> None:
        """Publish the blocks this step completed (before postprocess advances the counters, as nano-vllm)."""
        twin = self._twin(seq)
        twin.num_cached_tokens, twin.num_scheduled_tokens = seq.num_computed_tokens, seq.num_scheduled_tokens
        self.manager.hash_blocks(twin)
        twin.num_scheduled_tokens = 0

    def room(self, seq: Any) -> int:
        """Positions after the newest token that the sequence's blocks already hold: where drafts may go without a new
        block (ch25's may_append adds one block at a time, for the newest token only)."""
        return len(seq.block_table) * self.block_size - len(seq.token_ids)
