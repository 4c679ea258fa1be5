"""ch32 · speculative decoding and determinism: the common mistakes, each with the hint that names it and the edit of
the reference that makes it (see `grader.authoring.misconceptions`).

The mistakes of verification are also simulated, one by one, by `grader.hidden.ch32_models.simulate`: a check
names one when the student's tokens are exactly what that simulation emits (`grader.checks.ch32.VARIANTS`)."""

from grader.authoring import mistake

ACCEPT = "if qx > 0 and float(uniforms[i]) < min(1.0, px / qx):"
RESIDUAL = "residual = (p[i] - q[i]).clamp_min(0)"
RECOVER = "out.append(int((residual / e[i]).argmax()))"
LOOP = (
    "    for k in range(x.shape[1]):\n"
    "        out = out + xa[:, k:k + 1] * wa[k]        # elementwise: each out[i, n] adds its k-th term, in order\n"
)
RMS_SPLIT = (
    "    for start in range(0, H, block):\n"
    "        chunk = squares[:, start:start + block]\n"
    "        chunk = torch.cat([chunk, chunk.new_zeros(B, block - chunk.shape[1])], dim=1)    # pad the last chunk\n"
    "        while chunk.shape[1] > 1:\n"
    "            half = chunk.shape[1] // 2\n"
    "            chunk = chunk[:, :half] + chunk[:, half:]\n"
    "        total = total + chunk[:, 0]\n"
)

MISTAKES = [
    # -- 32.1 verify_draft
    mistake(
        "no_bonus",
        "ch32.1",
        "when all k drafts are accepted, add the bonus token drawn from target_probs[k] with noise[k]: a "
        "verification emits accepted + 1 tokens",
        ("    out.append(int((p[k] / e[k]).argmax()))\n    return out", "    return out"),
    ),
    mistake(
        "no_stop",
        "ch32.1",
        "stop at the first rejection: the later drafts were drafted after the rejected token, which is not in the output",
        (f"        {RECOVER}\n        return out", f"        {RECOVER}"),
    ),
    mistake(
        "rejected_kept",
        "ch32.1",
        "a rejected draft is not emitted: the recovered token takes its place",
        (f"        {RESIDUAL}", f"        out.append(x)\n        {RESIDUAL}"),
    ),
    mistake(
        "from_p",
        "ch32.1",
        "at a rejection draw from max(0, p − q) renormalised, not from p: the drafter already offers some tokens "
        "too often, and only the mass it misses may be added back (else the output is not distributed as p)",
        (RESIDUAL, "residual = p[i]"),
    ),
    mistake(
        "reversed_residual",
        "ch32.1",
        "the recovered token comes from max(0, p − q): target minus draft",
        (RESIDUAL, "residual = (q[i] - p[i]).clamp_min(0)"),
    ),
    mistake(
        "inverse_ratio",
        "ch32.1",
        "accept with probability min(1, p(x) / q(x)): target over draft",
        (ACCEPT, "if qx > 0 and float(uniforms[i]) < min(1.0, qx / px):"),
    ),
    mistake(
        "flipped_accept",
        "ch32.1",
        "accept when u < min(1, p(x) / q(x)): a small u accepts",
        (ACCEPT, "if qx > 0 and float(uniforms[i]) >= min(1.0, px / qx):"),
    ),
    mistake(
        "greedy",
        "ch32.1",
        "that is greedy verification (accept while the draft equals argmax p); a sampled request accepts when "
        "u < min(1, p(x) / q(x)) and draws the rest with the noise",
        (ACCEPT, "if x == int(p[i].argmax()):"),
        (RECOVER, "out.append(int(p[i].argmax()))"),
    ),
    mistake(
        "next_noise_row",
        "ch32.1",
        "the race at position i uses noise[i]",
        (RECOVER, "out.append(int((residual / e[min(i + 1, k)]).argmax()))"),
    ),
    mistake(
        "bonus_row",
        "ch32.1",
        "the bonus token comes from target_probs[k] with noise[k], the target's distribution after the last draft",
        ("out.append(int((p[k] / e[k]).argmax()))", "out.append(int((p[k - 1] / e[k - 1]).argmax()))"),
    ),
    mistake(
        "unclamped_noise",
        "ch32.1",
        "clamp the noise to ≥ 1e-10 as in ch23: with E = 0, a zero weight gives 0 / 0 = NaN, which argmax picks",
        ("e = noise.to(dtype).clamp_min(1e-10)", "e = noise.to(dtype)"),
    ),
    mistake(
        "zero_q_accepted",
        "ch32.1",
        "a draft with q(x) = 0 could not have been drafted: reject it (vLLM does, since p(x) / q(x) is undefined)",
        (ACCEPT, "if qx == 0 or float(uniforms[i]) < min(1.0, px / qx):"),
    ),
    mistake(
        "half_precision",
        "ch32.1",
        "compute in float32 (float64 for float64 inputs), whatever the probabilities come in: in float16 a score p / E above "
        "65504 is inf, and the 1e-10 clamp of the noise is 0, so two tokens with small noise tie and the lower index "
        "wins whatever their probabilities",
        (
            "dtype = torch.promote_types(torch.promote_types(draft_probs.dtype, target_probs.dtype), torch.float32)",
            "dtype = torch.promote_types(draft_probs.dtype, target_probs.dtype)",
        ),
    ),
    # -- 32.2 num_drafts_to_verify
    mistake(
        "per_item",
        "ch32.2",
        "the survival of draft j is the product c0 · … · cj, not cj on its own: a confident late draft cannot rescue a weak prefix",
        ("survival *= c", "survival = c"),
    ),
    mistake(
        "strict", "ch32.2", "a survival equal to the threshold still counts (≥)", ("if survival < threshold:", "if survival <= threshold:")
    ),
    mistake(
        "count_first_below",
        "ch32.2",
        "n counts the drafts whose survival is ≥ threshold: the first draft below it is not sent",
        (
            "        if survival < threshold:\n            break\n        n += 1",
            "        n += 1\n        if survival < threshold:\n            break",
        ),
    ),
    # -- 32.3 batch_invariant_matmul
    mistake(
        "low_precision_acc",
        "ch32.3",
        "accumulate in float32 and cast the result to {dtype} once at the end",
        ("acc = torch.float64 if x.dtype == torch.float64 else torch.float32\n    xa, wa", "acc = x.dtype\n    xa, wa"),
    ),
    mistake(
        "batch_dependent",
        "ch32.3",
        "nothing in a row's reduction may depend on the batch: not the number of rows (a split chosen by B), not "
        "the row's position, not the other rows",
        (
            LOOP.rstrip("\n"),
            "    splits = 4 if x.shape[0] < 4 else 1\n"
            "    for part in torch.arange(x.shape[1]).chunk(splits):\n"
            "        partial = torch.zeros_like(out)\n"
            "        for k in part.tolist():\n"
            "            partial = partial + xa[:, k:k + 1] * wa[k]\n"
            "        out = out + partial",
        ),
    ),
    mistake(
        "plain_matmul",
        "ch32.3",
        "that is plain x @ w: the library picks how each row is summed from the shape (kernel, tiles, split-K, "
        "threads), so its bits are neither those of the order k = 0 … K − 1 nor promised to stay the same from "
        "one batch size to the next; add the terms yourself, in that order",
        (LOOP, "    out = x @ w\n"),
    ),
    mistake(
        "upcast_plain",
        "ch32.3",
        "@ on float64 copies fixes no order: it hides the library's order behind extra precision and a final "
        "rounding, and for float64 inputs it is plain x @ w; add the terms in the order k = 0 … K − 1 in a "
        "float32 accumulator",
        (LOOP, "    out = xa.double() @ wa.double()\n"),
    ),
    # A fused multiply-add rounds once where the order rounds twice; whether torch.addcmul fuses depends on the CPU,
    # so tests/test_ch32.py shows this one where it does.
    mistake(
        "fused_madd",
        "ch32.3",
        "torch.addcmul (or addmm, baddbmm) may fuse the multiply and the add into one rounding; the order rounds "
        "the product, then the sum: write out = out + x[:, k:k + 1] * w[k]",
    ),
    # -- 32.4 batch_invariant_rms_norm
    mistake(
        "rms_plain_sum",
        "ch32.4",
        "torch.sum and .mean choose their own order (vector lanes, threads, split reductions picked by the "
        "shape); sum the squares in chunks of `block`, each chunk by halving, the chunk sums in order",
        (RMS_SPLIT, "    total = squares.sum(dim=1)\n"),
    ),
    mistake(
        "rms_batch_split",
        "ch32.4",
        "the chunk width (and the tree) must not depend on the batch: a kernel that splits a row more finely "
        "when there are few rows sums a request alone in another order than in a batch",
        (
            "    for start in range(0, H, block):",
            "    block = block if B >= 4 else max(1, block // 2)\n    for start in range(0, H, block):",
        ),
    ),
    mistake(
        "rms_chunk_sum",
        "ch32.4",
        "inside a chunk, sum by halving (s = s[:, :h] + s[:, h:] while the chunk is wider than 1): torch.sum "
        "over the chunk picks its own order",
        (
            "        chunk = torch.cat([chunk, chunk.new_zeros(B, block - chunk.shape[1])], dim=1)    # pad the last chunk\n"
            "        while chunk.shape[1] > 1:\n"
            "            half = chunk.shape[1] // 2\n"
            "            chunk = chunk[:, :half] + chunk[:, half:]\n"
            "        total = total + chunk[:, 0]",
            "        total = total + chunk.sum(dim=1)",
        ),
    ),
    mistake(
        "rms_cast_first",
        "ch32.4",
        "multiply by the weight in the accumulator and cast to x's dtype once at the end, as vLLM's "
        "batch-invariant kernel does (ch20's nano-vllm RMSNorm casts before the weight; this task does not)",
        ("    return (xa * inv_rms[:, None] * weight.to(acc)).to(x.dtype)", "    return (xa * inv_rms[:, None]).to(x.dtype) * weight"),
    ),
]
