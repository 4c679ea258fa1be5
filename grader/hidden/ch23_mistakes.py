"""ch23 · sampling: the common mistakes, each with the hint that names it and the edit of the reference that makes
it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

# The reference's top-k fill, and its race (edited below).
TOPK_FILL = 'z = z.masked_fill(z < kth, float("-inf"))'
RACE = "(probs / noise.to(torch.float32).clamp_min(1e-10))"
RACE_P = "(logits.to(torch.float32) / temp[:, None]).softmax"

MISTAKES = [
    # -- ch23.1 process_logits: temperature ------------------------------------------------------------------
    mistake(
        "temperature_multiplied",
        "ch23.1",
        "divide by the temperature (logits / T), don't multiply: T < 1 must sharpen the distribution",
        ("z = logits.to(torch.float32) / temp", "z = logits.to(torch.float32) * temp"),
    ),
    mistake(
        "temperature_ignored",
        "ch23.1",
        "apply the temperature: divide row {b} by its own temperature[{b}] = {T}",
        ("z = logits.to(torch.float32) / temp[:, None]", "z = logits.to(torch.float32)"),
    ),
    mistake(
        "probabilities",
        "ch23.1",
        "return logits (−∞ where filtered), not probabilities: the softmax comes later, in sample",
        ("    return z\n", "    return z.softmax(dim=-1)\n"),
    ),
    # -- ch23.1 process_logits: top-k ---------------------------------------------------------------------------
    mistake(
        "large_negative",
        "ch23.1",
        "a filtered entry must be exactly −∞ (float('-inf')), not a large negative number",
        (TOPK_FILL, "z = z.masked_fill(z < kth, -1e9)"),
    ),
    mistake(
        "topk_off_by_one",
        "ch23.1",
        "top-k keeps the k = {k} largest entries; yours kept {n}: the threshold is the {kth} largest value "
        "(index k − 1 of the row sorted in descending order)",
        ("gather(1, (k - 1)[:, None])", "gather(1, k.clamp(max=V - 1)[:, None])"),
    ),
    mistake(
        "strict_k",
        "ch23.1",
        "entries equal to the k-th largest value stay too: keep every entry ≥ the threshold (vLLM compares with "
        "the k-th value, it does not take exactly k indices)",
        (TOPK_FILL, 'z = z.masked_fill(z.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1) >= k[:, None], float("-inf"))'),
    ),
    # -- ch23.1 process_logits: top-p ---------------------------------------------------------------------------
    mistake(
        "crossing_dropped",
        "ch23.1",
        "the entry whose probability crosses top_p stays: an entry goes only when it and all smaller entries "
        "hold ≤ 1 − top_p (i.e. the larger ones already hold ≥ top_p)",
        (
            "ascending, order = z.sort(dim=-1)\n        mass = ascending",
            "descending, order = z.sort(dim=-1, descending=True)\n        mass = descending",
        ),
        ("drop = mass <= (1 - p)[:, None]", "drop = mass > p[:, None]"),
        ("drop[:, -1] = False", "drop[:, 0] = False"),
    ),
    mistake(
        "topp_strict",
        "ch23.1",
        "an entry goes when it and the smaller entries hold ≤ 1 − top_p, equality included (vLLM: probs_sum <= 1 − p): "
        "where the mass lands exactly on 1 − top_p, as with 2ⁿ equal entries, that entry is removed",
        ("drop = mass <= (1 - p)[:, None]", "drop = mass < (1 - p)[:, None]"),
    ),
    mistake(
        "topp_first",
        "ch23.1",
        "run top-k first: top-p works on the softmax of what top-k kept (renormalised), not on the full row",
        ("    if k is not None:\n", "    scaled = z\n    if k is not None:\n"),
        ("ascending, order = z.sort(dim=-1)", "ascending, order = scaled.sort(dim=-1)"),
    ),
    mistake(
        "topp_before_temperature",
        "ch23.1",
        "apply the temperature before top-p: the probabilities are softmax(logits / T)",
        ("ascending, order = z.sort(dim=-1)", "ascending, order = (z * temp[:, None]).sort(dim=-1)"),
    ),
    # -- ch23.2 sample: the race ------------------------------------------------------------------------------
    mistake(
        "argmax_p",
        "ch23.2",
        "the race takes argmax(p / E), not argmax(p): the noise lets a less likely token win, exactly as often as its probability",
        (RACE, "probs"),
    ),
    mistake(
        "noise_over_p",
        "ch23.2",
        "divide p by the noise (argmax p / E, or argmin E / p), not the noise by p: argmax E / p favours the unlikely tokens",
        (RACE, "(noise.to(torch.float32).clamp_min(1e-10) / probs)"),
    ),
    mistake(
        "times_noise",
        "ch23.2",
        "divide p by the noise E; multiplying by E does not sample from p",
        (RACE, "(probs * noise.to(torch.float32).clamp_min(1e-10))"),
    ),
    mistake(
        "race_logits",
        "ch23.2",
        "race with the probabilities p = softmax(logits / T), not with the logits",
        ("probs = (logits.to(torch.float32) / temp[:, None]).softmax(dim=-1)", "probs = logits.to(torch.float32) / temp[:, None]"),
    ),
    mistake(
        "unclamped",
        "ch23.2",
        "clamp the noise to ≥ 1e-10 as nano-vllm does: with E = 0, p / E is ∞ (or NaN = 0 / 0 on a filtered token), and argmax picks it",
        ("noise.to(torch.float32).clamp_min(1e-10))", "noise.to(torch.float32))"),
    ),
    mistake(
        "own_randomness",
        "ch23.2",
        "the token must be argmax(p / E) with the noise passed in; a sampler with its own randomness "
        "(torch.multinomial, a fresh exponential_()) cannot reproduce the race",
        (RACE + ".argmax(dim=-1)", "torch.multinomial(probs, 1)[:, 0]"),
    ),
    mistake(
        "no_upcast",
        "ch23.2",
        "upcast the logits to float32 before the temperature and the softmax, as nano-vllm (logits.float()) and vLLM's "
        "sampler do: bfloat16 keeps 8 significant bits (float16 11), so two probabilities less than 1 part in 256 "
        "(in 2048) apart round to one value and the race then favours the lower index",
        (
            "temp = temperature.to(torch.float32)\n    probs = (logits.to(torch.float32) / temp[:, None])",
            "temp = temperature.to(logits.dtype)\n    probs = (logits / temp[:, None])",
        ),
        ("noise.to(torch.float32).clamp_min(1e-10))", "noise.to(probs.dtype).clamp_min(1e-10))"),
    ),
    mistake("same_token", "ch23.2", "every row drew the same token: the race must use each row's own noise, argmax(p / E) per row"),
    # -- ch23.2 sample: the temperature ---------------------------------------------------------------------------
    mistake(
        "race_temperature_multiplied",
        "ch23.2",
        "divide the logits by the temperature, don't multiply: p = softmax(logits / T)",
        (RACE_P, "(logits.to(torch.float32) * temp[:, None]).softmax"),
    ),
    mistake(
        "race_temperature_ignored",
        "ch23.2",
        "apply the temperature: p = softmax(logits / T), each row with its own T",
        (RACE_P, "logits.to(torch.float32).softmax"),
    ),
    mistake(
        "race_temperature",
        "ch23.2",
        "p = softmax(logits / T): your tokens match a race that leaves the temperature out or multiplies by it",
    ),
]
