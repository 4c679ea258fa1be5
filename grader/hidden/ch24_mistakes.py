"""ch24 · the control loop and its counters: the common mistakes, each with the hint that names it and the edit
of the reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

POSTPROCESS_COUNT = "            seq.num_computed_tokens += seq.num_scheduled_tokens\n"
APPEND_AND_FINISH = (
    "            seq.append_token(token)\n"
    "            if (not seq.ignore_eos and token == self.eos) or seq.num_completion_tokens == seq.max_tokens:\n"
)
PROGRESS_KEEP = "        if computed == total:\n            total += 1\n"

MISTAKES = [
    # -- ch24.1: which step, which batch ----------------------------------------------------------------------
    mistake(
        "decode_first",
        "ch24.1",
        "decode before prefill: prefill has strict priority; schedule() decodes only when no waiting sequence can be prefilled",
        (
            "        while self.waiting and len(scheduled) < self.max_num_seqs:",
            "        while self.waiting and len(scheduled) < self.max_num_seqs and not self.running:",
        ),
    ),
    mistake(
        "prefill_without_blocks",
        "ch24.1",
        "nothing can be prefilled: waiting[0] = {head} needs blocks for all its tokens and only {free} are free; "
        "FCFS means no later request is tried instead",
    ),
    mistake(
        "max_num_seqs",
        "ch24.1",
        "at most max_num_seqs = {n} sequences per batch",
        ("        while self.running and len(scheduled) < self.max_num_seqs:", "        while self.running:"),
    ),
    mistake(
        "decode_order",
        "ch24.1",
        "the decode batch takes sequences from the left end of running, in order",
        ("            seq = self.running.popleft()\n", "            seq = self.running.pop()\n"),
    ),
    mistake("skip_head", "ch24.1", "strict FCFS: waiting[0] is never skipped; {head} does not fit, so the batch stops before {next}"),
    mistake(
        "budget_used_up",
        "ch24.1",
        "the token budget ({budget}) is used up, so the batch stops",
        ("            if remaining == 0:\n                break\n", ""),
        ("            if remaining < to_compute and scheduled:\n                break\n", ""),
    ),
    mistake(
        "second_chunked",
        "ch24.1",
        "only the first sequence of a batch may be chunked: {head} needs {need} tokens and only {left} are left "
        "in the budget, so the batch stops",
        ("            if remaining < to_compute and scheduled:\n                break\n", ""),
    ),
    mistake(
        "admit_without_blocks", "ch24.1", "{head} needs blocks for all its {tokens} tokens and only {free} are free, so the batch stops"
    ),
    mistake(
        "fcfs_order",
        "ch24.1",
        "strict FCFS: the sequences are taken from the head of waiting in order; {first} comes first",
        ("            seq = self.waiting[0]\n", "            seq = self.waiting[-1]\n"),
        (
            "                self.waiting.popleft()\n                self.running.append(seq)",
            "                self.waiting.pop()\n                self.running.append(seq)",
        ),
    ),
    mistake(
        "stops_early",
        "ch24.1",
        "{name} fits too: its {n} tokens are within the {left} left in the budget, and the prefill loop goes on while waiting[0] fits",
        ("            if remaining < to_compute and scheduled:", "            if scheduled:"),
    ),
    # -- ch24.1: how many tokens -----------------------------------------------------------------------------
    mistake(
        "decode_one_token",
        "ch24.1",
        "a decode step computes exactly one token per sequence",
        ("                seq.num_scheduled_tokens = 1\n", "                seq.num_scheduled_tokens = seq.num_tokens\n"),
    ),
    mistake(
        "chunk_over_budget",
        "ch24.1",
        "a chunk never exceeds the token budget left",
        ("            seq.num_scheduled_tokens = min(to_compute, remaining)", "            seq.num_scheduled_tokens = to_compute"),
    ),
    mistake(
        "chunk_recounts_prompt",
        "ch24.1",
        "a sequence mid-prefill has only num_tokens − num_computed_tokens tokens left to compute",
        ("                to_compute = seq.num_tokens - seq.num_computed_tokens", "                to_compute = seq.num_tokens"),
    ),
    # -- ch24.1: preemption ------------------------------------------------------------------------------------
    mistake(
        "victim_next_in_line",
        "ch24.1",
        "yours preempted {name}, which should be decoded in this step: when a decode needs a block, the victim is "
        "the sequence at the right end of running ({victim}), not the next one in line",
        (
            "                if self.running:\n                    self.preempt(self.running.pop())\n                else:\n"
            "                    self.preempt(seq)\n                    break\n",
            "                self.preempt(seq)\n                break\n",
        ),
    ),
    mistake(
        "needless_preemption",
        "ch24.1",
        "yours preempted {name}, which should be decoded in this step: no sequence needs to be preempted in this step",
        ("            while not self.block_manager.can_append(seq):", "            while not self.block_manager.num_free_blocks:"),
    ),
    mistake(
        "no_preemption",
        "ch24.1",
        "{name} had to be preempted in this step to free a block; the victim is the sequence at the right end of running",
    ),
    mistake(
        "head_victim",
        "ch24.1",
        "preempted from the head instead of the tail: the victim is the sequence at the right end of running "
        "({victim}), the most recently admitted, not one nearer its left end",
        ("self.preempt(self.running.pop())", "self.preempt(self.running.popleft())"),
    ),
    mistake("wrong_victim", "ch24.1", "when a decode needs a block and none is free, preempt the sequence at the right end of running"),
    mistake(
        "victim_to_back",
        "ch24.1",
        "a preempted sequence goes to the front of waiting (appendleft), ahead of requests that never ran; "
        "several victims of one step end up in their running order",
        ("self.waiting.appendleft(seq)", "self.waiting.append(seq)"),
    ),
    mistake(
        "preempt_keeps_computed",
        "ch24.1",
        "preemption recomputes from scratch: reset the victim's num_computed_tokens to 0",
        ("        seq.status = WAITING\n        seq.num_computed_tokens = 0\n", "        seq.status = WAITING\n"),
    ),
    mistake(
        "preempted_status",
        "ch24.1",
        "a preempted sequence is WAITING again",
        ("        seq.status = WAITING\n        seq.num_computed_tokens = 0\n", "        seq.num_computed_tokens = 0\n"),
    ),
    mistake(
        "preempt_keeps_blocks",
        "ch24.1",
        "preemption gives the victim's blocks back (deallocate)",
        ("        self.block_manager.deallocate(seq)\n        self.waiting.appendleft(seq)", "        self.waiting.appendleft(seq)"),
    ),
    # -- ch24.1: the queues and the status -----------------------------------------------------------------------
    mistake(
        "running_too_late",
        "ch24.1",
        "{name}'s chunk completes its prompt, so schedule() makes it RUNNING and moves it from waiting to the right end of running",
        (
            "            if seq.num_computed_tokens + seq.num_scheduled_tokens == seq.num_tokens:",
            "            if seq.num_computed_tokens == seq.num_tokens:",
        ),
    ),
    mistake(
        "running_too_early",
        "ch24.1",
        "{name}'s chunk leaves tokens to compute: it stays at the head of waiting, WAITING",
        ("            if seq.num_computed_tokens + seq.num_scheduled_tokens == seq.num_tokens:", "            if True:"),
    ),
    mistake(
        "batch_back_left",
        "ch24.1",
        "after a decode the batch goes back to the left end of running, in its order",
        ("        self.running.extendleft(reversed(scheduled))", "        self.running.extend(scheduled)"),
    ),
    mistake(
        "running_status_late",
        "ch24.1",
        "a sequence becomes RUNNING when its final chunk is scheduled (in schedule(), before the model runs)",
        ("                seq.status = RUNNING\n                self.waiting.popleft()", "                self.waiting.popleft()"),
    ),
    mistake(
        "running_status_early",
        "ch24.1",
        "a sequence stays WAITING until the chunk that completes its prompt is scheduled",
        (
            "                self.block_manager.allocate(seq)\n",
            "                self.block_manager.allocate(seq)\n                seq.status = RUNNING\n",
        ),
    ),
    mistake(
        "finished_in_running",
        "ch24.1",
        "remove a finished sequence ({name}) from running",
        ("                self.running.remove(seq)\n", ""),
    ),
    mistake(
        "is_finished",
        "ch24.1",
        "is_finished() is true exactly when both waiting and running are empty",
        ("        return not self.waiting and not self.running", "        return not self.waiting"),
    ),
    # -- ch24.1: the counters in postprocess -------------------------------------------------------------------
    mistake(
        "chunk_not_counted",
        "ch24.1",
        "postprocess adds each sequence's num_scheduled_tokens to num_computed_tokens, prefill and decode alike",
        (POSTPROCESS_COUNT, ""),
    ),
    mistake(
        "count_one",
        "ch24.1",
        "count the whole chunk ({chunk} tokens), not one token",
        (POSTPROCESS_COUNT, "            seq.num_computed_tokens += 1\n"),
    ),
    mistake(
        "computed_in_schedule",
        "ch24.1",
        "num_computed_tokens grows in postprocess, after the model ran, not in schedule()",
        (POSTPROCESS_COUNT, ""),
        (
            "            num_batched += seq.num_scheduled_tokens\n",
            "            num_batched += seq.num_scheduled_tokens\n            seq.num_computed_tokens += seq.num_scheduled_tokens\n",
        ),
        (
            "            if seq.num_computed_tokens + seq.num_scheduled_tokens == seq.num_tokens:",
            "            if seq.num_computed_tokens == seq.num_tokens:",
        ),
        (
            "                seq.num_scheduled_tokens = 1\n",
            "                seq.num_scheduled_tokens = 1\n                seq.num_computed_tokens += 1\n",
        ),
    ),
    mistake(
        "computed_includes_sample",
        "ch24.1",
        "the newly sampled token has no K/V yet: num_computed_tokens stays one behind num_tokens",
        ("            seq.append_token(token)\n", "            seq.append_token(token)\n            seq.num_computed_tokens += 1\n"),
    ),
    mistake(
        "scheduled_not_reset", "ch24.1", "postprocess resets num_scheduled_tokens to 0", ("            seq.num_scheduled_tokens = 0\n", "")
    ),
    mistake("scheduled_leftover", "ch24.1", "only the sequences of this step's batch have scheduled tokens"),
    # -- ch24.1: appending and finishing -------------------------------------------------------------------------
    mistake(
        "append_candidate",
        "ch24.1",
        "{name}'s prompt is not complete after this chunk ({computed} of {total} computed): postprocess discards the runner's token",
        ("            if is_prefill and seq.num_computed_tokens < seq.num_tokens:\n                continue\n", ""),
    ),
    mistake(
        "token_not_appended",
        "ch24.1",
        "once num_computed_tokens reaches num_tokens (a final chunk, or any decode) the token is appended",
        ("            if is_prefill and seq.num_computed_tokens < seq.num_tokens:", "            if is_prefill:"),
    ),
    mistake(
        "eos_not_appended",
        "ch24.1",
        "EOS is appended first, so it stays in the output; then the sequence finishes",
        (
            APPEND_AND_FINISH,
            "            if seq.ignore_eos or token != self.eos:\n                seq.append_token(token)\n"
            "            if (not seq.ignore_eos and token == self.eos) or seq.num_completion_tokens == seq.max_tokens:\n",
        ),
    ),
    mistake(
        "wrong_token",
        "ch24.1",
        "append exactly the token the runner returned for this sequence (tokens come in batch order)",
        ("        for seq, token in zip(seqs, token_ids):", "        for seq, token in zip(seqs, token_ids[::-1]):"),
    ),
    mistake(
        "eos_ignored",
        "ch24.1",
        "EOS finishes a sequence (it is appended first, so it stays in the output)",
        ("(not seq.ignore_eos and token == self.eos) or ", ""),
    ),
    mistake(
        "max_tokens_missed",
        "ch24.1",
        "finish when num_completion_tokens reaches max_tokens = {max_tokens} (checked after appending)",
        ("seq.num_completion_tokens == seq.max_tokens", "seq.num_completion_tokens > seq.max_tokens"),
    ),
    mistake(
        "eos_candidate_finishes",
        "ch24.1",
        "the candidate of an unfinished chunk is discarded, even when it is EOS",
        (
            "            if is_prefill and seq.num_computed_tokens < seq.num_tokens:\n                continue\n",
            "            if is_prefill and seq.num_computed_tokens < seq.num_tokens:\n"
            "                if token == self.eos and not seq.ignore_eos:\n                    seq.status = FINISHED\n"
            "                continue\n",
        ),
    ),
    mistake(
        "ignore_eos_ignored",
        "ch24.1",
        "ignore_eos: this request stops only at max_tokens",
        ("(not seq.ignore_eos and token == self.eos)", "(token == self.eos)"),
    ),
    mistake(
        "max_tokens_total",
        "ch24.1",
        "max_tokens = {max_tokens} counts completion tokens; this one has {n}",
        ("seq.num_completion_tokens == seq.max_tokens", "seq.num_tokens >= seq.max_tokens"),
    ),
    # -- ch24.1: blocks --------------------------------------------------------------------------------------------
    mistake(
        "no_free_on_finish",
        "ch24.1",
        "a finished sequence gives its blocks back (deallocate)",
        (
            "                seq.status = FINISHED\n                self.block_manager.deallocate(seq)\n",
            "                seq.status = FINISHED\n",
        ),
    ),
    mistake(
        "no_may_append",
        "ch24.1",
        "its newest token starts a new block: call block_manager.may_append in the decode step",
        ("                self.block_manager.may_append(seq)\n", ""),
    ),
    mistake("chunk_blocks", "ch24.1", "allocate blocks for all of the sequence's tokens when it is admitted, not just for the chunk"),
    mistake("blocks_lost", "ch24.1", "every block a sequence gives back (finished or preempted) returns to the free list"),
    # -- ch24.2: the three progresses -----------------------------------------------------------------------------
    mistake(
        "progress_preempt_keeps", "ch24.2", "reset num_computed_tokens to 0 on preemption", ("        computed = 0\n", "        pass\n")
    ),
    mistake(
        "hit_ignored",
        "ch24.2",
        "an admitted request starts from its prefix hit: the cache served those tokens",
        ("            computed = prefix_hit\n", "            computed = 0\n"),
    ),
    mistake(
        "progress_not_counted",
        "ch24.2",
        "the chunk was not counted: add num_scheduled to num_computed_tokens",
        ("        computed += num_scheduled\n", ""),
    ),
    mistake(
        "progress_computed_includes_sample",
        "ch24.2",
        "the newly kept token has no K/V yet: num_computed_tokens stays one behind num_tokens",
        (PROGRESS_KEEP, "        if computed == total:\n            total += 1\n            computed += 1\n"),
    ),
    mistake("progress_sample_dropped", "ch24.2", "the sample of a step that reaches num_tokens is appended", (PROGRESS_KEEP, "")),
    mistake(
        "keep_every_sample", "ch24.2", "the candidate token of an unfinished chunk was appended", (PROGRESS_KEEP, "        total += 1\n")
    ),
    mistake(
        "progress_tokens_computed",
        "ch24.2",
        "num_tokens counts known tokens (prompt + kept outputs), not computed ones",
        (PROGRESS_KEEP, "        total += num_scheduled\n"),
    ),
    mistake(
        "preempt_resets_only_computed",
        "ch24.2",
        "preemption resets the computed count only",
        ("        computed = 0\n", "        computed, cached = 0, -1\n"),
    ),
    mistake(
        "cached_is_computed",
        "ch24.2",
        "num_cached_tokens is the prefix-cache hit, not the computed count (nano-vllm HEAD uses the name for the "
        "computed count; vLLM does not)",
        ('            "num_cached_tokens": cached}', '            "num_cached_tokens": computed}'),
    ),
    mistake(
        "cached_again",
        "ch24.2",
        "a re-admission after preemption does not set it again",
        ("            if cached < 0:\n                cached = prefix_hit\n", "            cached = prefix_hit\n"),
    ),
]
