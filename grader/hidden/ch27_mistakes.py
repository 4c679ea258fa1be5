"""ch27 · the engine core loop: the common mistakes, each with the hint that names it and the edit of the
reference that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

SYNC_LOOP = "            for token in runner_output.get(rid, []):\n"
ASYNC_LOOP = "            for token in sampled:\n"
APPEND = "                request.output_token_ids.append(token)\n                new_token_ids.append(token)\n"
EOS = "                if token == request.eos_token_id:\n                    request.status = FINISHED_STOPPED\n"
CAP = "                elif request.num_output_tokens >= request.max_tokens:\n                    request.status = FINISHED_LENGTH_CAPPED\n"
SYNC_END = (
    '            if new_token_ids:\n                outputs.append({"request_id": rid, "new_token_ids": new_token_ids, '
    '"finished": request.is_finished})\n        return outputs\n        ### END SOLUTION\n\n    def step(self) -> '
    'list[dict]:\n        """One engine step: schedule, execute'
)
SPEC_REJECTED = "        num_rejected = len(scheduled_spec_token_ids) + 1 - len(generated_token_ids)\n"
SPEC_ROLLBACK = (
    "    if scheduled_spec_token_ids and generated_token_ids:\n" + SPEC_REJECTED + "        request.num_computed_tokens -= num_rejected\n"
)
SPEC_LOOP = "    for token in generated_token_ids:\n"
PLACEHOLDER = (
    "            if request.num_computed_tokens == request.num_tokens + request.num_output_placeholders:\n"
    "                request.num_output_placeholders += 1\n"
)

MISTAKES = [
    # -- the scheduler's side: schedule() --------------------------------------------------------------------
    mistake(
        "computed_not_advanced",
        "ch27.1",
        "num_computed_tokens grows by the scheduled tokens in schedule(), before the model runs",
        ("            request.num_computed_tokens += n\n", ""),
    ),
    mistake(
        "computed_at_update",
        "ch27.1",
        "num_computed_tokens is advanced at schedule time (optimistic), not when the output comes back",
        ("            request.num_computed_tokens += n\n        return", "        return"),
        (
            "            new_token_ids = []\n" + SYNC_LOOP,
            '            request.num_computed_tokens += scheduler_output["num_scheduled_tokens"][rid]\n'
            "            new_token_ids = []\n" + SYNC_LOOP,
        ),
    ),
    mistake(
        "status_not_running",
        "ch27.1",
        "a request becomes RUNNING when it is scheduled for the first time",
        ("                request.status = RUNNING\n", ""),
    ),
    mistake(
        "prompt_every_time",
        "ch27.1",
        "the worker sees the prompt only the first time (scheduled_new_reqs), diffs afterwards",
        (
            "                request.status = RUNNING\n                new_reqs[rid] = list(request.prompt_token_ids)\n",
            "                request.status = RUNNING\n            new_reqs[rid] = list(request.prompt_token_ids)\n",
        ),
    ),
    mistake("two_batches", "ch27.1", "one step launches at most one batch"),
    # -- the scheduler's side: update_from_output() -------------------------------------------------------------
    mistake(
        "sample_not_appended",
        "ch27.1",
        "the worker sampled {tokens} for {rid}: append it to its outputs",
        (SYNC_LOOP + APPEND, SYNC_LOOP + "                new_token_ids.append(token)\n"),
    ),
    mistake(
        "length_first",
        "ch27.1",
        "the last token is this request's EOS: FINISHED_STOPPED, even when it is also the last token max_tokens "
        "allows; today's vLLM check_stop (vllm/v1/core/sched/utils.py) tests EOS before the length cap (vLLM up "
        "to v0.11.0 tested the length cap first)",
        (
            SYNC_LOOP + APPEND + EOS + CAP,
            SYNC_LOOP + APPEND + "                if request.num_output_tokens >= request.max_tokens:\n"
            "                    request.status = FINISHED_LENGTH_CAPPED\n"
            "                elif token == request.eos_token_id:\n"
            "                    request.status = FINISHED_STOPPED\n",
        ),
    ),
    mistake(
        "eos_missed",
        "ch27.1 ch27.2",
        "the newest token is this request's EOS: it stops the request (FINISHED_STOPPED) and stays in the output",
        (SYNC_LOOP + APPEND + EOS + CAP, SYNC_LOOP + APPEND + CAP.replace("elif", "if")),
        (ASYNC_LOOP + APPEND + EOS + CAP, ASYNC_LOOP + APPEND + CAP.replace("elif", "if")),
    ),
    mistake(
        "length_cap_missed",
        "ch27.1 ch27.2",
        "a request stops as soon as num_output_tokens reaches max_tokens",
        (SYNC_LOOP + APPEND + EOS + CAP, SYNC_LOOP + APPEND + EOS + CAP.replace(">=", ">")),
        (ASYNC_LOOP + APPEND + EOS + CAP, ASYNC_LOOP + APPEND + EOS + CAP.replace(">=", ">")),
    ),
    mistake(
        "appended_after_eos",
        "ch27.1 ch27.2",
        "{rid} stopped at EOS {eos}: nothing is appended after it; an output that arrives for a finished request is stale and is dropped",
    ),
    mistake(
        "finished_removed",
        "ch27.1",
        "keep every request in self.requests, finished ones too: the course reads their final state",
        (
            SYNC_END,
            SYNC_END.replace(
                "        return outputs\n",
                "        for out in outputs:\n"
                '            if out["finished"]:\n'
                '                del self.requests[out["request_id"]]\n'
                "        return outputs\n",
            ),
        ),
    ),
    # -- what the step returns -------------------------------------------------------------------------------
    mistake(
        "empty_outputs",
        "ch27.1",
        "a request that got no token this step (a non-final prefill chunk) emits nothing",
        (SYNC_END, SYNC_END.replace("            if new_token_ids:\n                outputs.append", "            outputs.append")),
    ),
    mistake(
        "partial_reported",
        "ch27.1",
        "an empty list from the runner is a partial prefill: nothing to append, nothing to report",
        (SYNC_END, SYNC_END.replace("            if new_token_ids:\n                outputs.append", "            outputs.append")),
    ),
    mistake("extra_outputs", "ch27.1", "only requests that got new tokens this step report them"),
    mistake(
        "finished_flag",
        "ch27.1",
        "'finished' says whether this output finished the request",
        (SYNC_END, SYNC_END.replace('"finished": request.is_finished', '"finished": False')),
    ),
    # -- async scheduling ------------------------------------------------------------------------------------------
    mistake(
        "no_launch_ahead",
        "ch27.2",
        "async scheduling launches the next batch before the previous one's output is back: the request already "
        "counts a placeholder for the token in flight, so plan_tokens gives it its next decode",
        (
            "        if self.has_unfinished_requests():\n            scheduler_output = self.schedule()\n"
            '            if scheduler_output["num_scheduled_tokens"]:\n                future',
            "        if self.has_unfinished_requests() and not self.batch_queue:\n"
            "            scheduler_output = self.schedule()\n"
            '            if scheduler_output["num_scheduled_tokens"]:\n                future',
        ),
    ),
    mistake(
        "empty_batch_launched",
        "ch27.2",
        "a batch is launched only when the plan is not empty; with a full queue, reconcile the oldest batch",
        (
            '            if scheduler_output["num_scheduled_tokens"]:\n                future',
            "            if True:\n                future",
        ),
    ),
    mistake(
        "placeholder_always",
        "ch27.2",
        "a non-final prefill chunk produces no token, so it gets no placeholder: add one only when "
        "num_computed_tokens reaches num_tokens + num_output_placeholders",
        (PLACEHOLDER, "            request.num_output_placeholders += 1\n"),
    ),
    mistake(
        "placeholder_missing",
        "ch27.2",
        "a step that reaches the end of the known tokens adds one output placeholder at schedule time: its token is still in flight",
        (PLACEHOLDER, ""),
    ),
    mistake(
        "placeholder_not_resolved",
        "ch27.2",
        "each sampled token that arrives resolves one placeholder (num_output_placeholders −= the number of "
        "tokens sampled for the request in that batch)",
        ("            request.num_output_placeholders -= len(sampled)\n", ""),
    ),
    mistake(
        "newest_first",
        "ch27.2",
        "{token} comes from the batch launched in this very step; with a queue of 2 the batch reconciled now is "
        "the older one (pop from the right of the queue you appendleft to)",
        ("self.batch_queue.pop()", "self.batch_queue.popleft()"),
    ),
    mistake(
        "outputs_out_of_order",
        "ch27.2",
        "outputs come back in launch order: reconcile the oldest batch first (pop from the right of the queue you appendleft to)",
    ),
    mistake(
        "stale_kept",
        "ch27.2",
        "{rid} had already finished ({status}): an output that arrives for a finished request is stale and is dropped",
        ("            if request.is_finished:\n                continue\n", ""),
    ),
    mistake(
        "stale_emitted",
        "ch27.2",
        "an output that arrives for a finished request is stale: drop it",
        ("            if request.is_finished:\n                continue\n", ""),
    ),
    # -- speculative decoding: schedule_spec() and update_spec() ----------------------------------------------------
    mistake(
        "drafts_not_scheduled",
        "ch27.3",
        "a draft is a token to compute like any other: n = num_tokens_with_spec − num_computed_tokens, so a "
        "decode with k drafts schedules 1 + k tokens (its newest token and the drafts)",
        (
            "    n = request.num_tokens_with_spec - request.num_computed_tokens\n",
            "    n = request.num_tokens - request.num_computed_tokens\n",
        ),
    ),
    mistake(
        "spec_not_cleared",
        "ch27.3",
        "the drafts move into the scheduler output and the request's spec_token_ids is cleared at schedule "
        "time; left there, a step without new drafts schedules the stale ones again",
        ("    request.spec_token_ids = []\n    return", "    return"),
    ),
    mistake(
        "no_rollback",
        "ch27.3",
        "the rejected drafts were counted in num_computed_tokens at schedule time but their KV is garbage: roll "
        "num_computed_tokens back by num_rejected = k + 1 − len(generated_token_ids)",
        (SPEC_ROLLBACK, ""),
    ),
    mistake(
        "rollback_without_output",
        "ch27.3",
        "roll back only when there were drafts and something was generated: an output that comes back empty "
        "(its sample discarded, the request preempted or aborted meanwhile) verified nothing, and k + 1 − 0 "
        "would take back positions that were never rejected (vLLM's update_from_output has this guard)",
        ("    if scheduled_spec_token_ids and generated_token_ids:\n", "    if scheduled_spec_token_ids:\n"),
    ),
    mistake(
        "rollback_one_too_many",
        "ch27.3",
        "rolled back one position too many: the target's own token (the bonus, or the correction at the first "
        "rejected draft) is a new output, not a scheduled position; num_rejected = k + 1 − len(generated) = k − a",
        (SPEC_REJECTED, "        num_rejected = len(scheduled_spec_token_ids) - (len(generated_token_ids) - 1) + 1\n"),
    ),
    mistake(
        "bonus_rejected",
        "ch27.3",
        "the last generated token is the target model's own (the bonus when every draft was accepted, else the "
        "correction): it is kept and appended, never rejected; only the k − a drafts after the accepted ones are",
        (SPEC_REJECTED, "        num_rejected = len(scheduled_spec_token_ids) + 1 - (len(generated_token_ids) - 1)\n"),
        (SPEC_LOOP, "    for token in generated_token_ids[:-1] if scheduled_spec_token_ids else generated_token_ids:\n"),
    ),
    mistake(
        "bonus_as_draft",
        "ch27.3",
        "rolled back one position too few: of the a + 1 generated tokens only a are accepted drafts, the last is "
        "the target's own; num_rejected = k + 1 − len(generated_token_ids)",
        (SPEC_REJECTED, "        num_rejected = len(scheduled_spec_token_ids) - len(generated_token_ids)\n"),
    ),
    mistake(
        "spec_not_trimmed",
        "ch27.3",
        "a stop among the generated tokens ends the request there: the tokens after it are dropped (vLLM trims "
        "new_token_ids), neither appended nor returned",
        ("        if request.is_finished:\n            break\n    return new_token_ids\n", "    return new_token_ids\n"),
    ),
    mistake(
        "rollback_after_trim",
        "ch27.3",
        "num_rejected counts from what the target generated (k + 1 − len(generated_token_ids)), before a stop "
        "trims the tokens: roll back before appending, as update_from_output does",
        (SPEC_ROLLBACK, ""),
        (
            "            break\n    return new_token_ids\n",
            "            break\n    if scheduled_spec_token_ids and new_token_ids:\n"
            "        request.num_computed_tokens -= len(scheduled_spec_token_ids) + 1 - len(new_token_ids)\n"
            "    return new_token_ids\n",
        ),
    ),
]
