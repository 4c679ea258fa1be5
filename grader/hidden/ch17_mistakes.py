"""ch17 · causal masks: the common mistakes, each with the hint that names it and the edit of the reference
that makes it (see `grader.authoring.misconceptions`)."""

from grader.authoring import mistake

CONVENTION = "True = may attend, the scaled_dot_product_attention convention"

MISTAKES = [
    mistake(
        "topleft",
        "ch17.2",
        "a chunk after a cached prefix is offset by num_cached: use tril with diagonal=num_cached, not the "
        "top-left corner (tril(ones(L, S)) gives the rows of positions 0 … L − 1)",
        (".tril(diagonal=num_cached)", ".tril()"),
    ),
    mistake(
        "drop_diagonal",
        "ch17.1",
        "keep the diagonal: the output at position i predicts token i + 1 and must see token i itself "
        "(torch.tril keeps it with its default diagonal=0)",
        ("dtype=torch.bool).tril()", "dtype=torch.bool).tril(diagonal=-1)"),
    ),
    mistake(
        "drop_diagonal_offset",
        "ch17.2",
        "keep the diagonal: query i sees its own key num_cached + i, so tril's diagonal is num_cached, not num_cached − 1",
        (".tril(diagonal=num_cached)", ".tril(diagonal=num_cached - 1)"),
    ),
    mistake(
        "inverted",
        "ch17.1 ch17.2",
        f"{CONVENTION}; your mask is its inverse, True where a key is hidden (an additive mask would put −∞ "
        "there; a bool mask keeps True for the visible keys)",
        ("dtype=torch.bool).tril()", "dtype=torch.bool).triu(diagonal=1)"),
        (".tril(diagonal=num_cached)", ".triu(diagonal=num_cached + 1)"),
    ),
    mistake(
        "triu",
        "ch17.1 ch17.2",
        "rows are queries and columns keys: a query sees the keys before it (tril), not the ones after it (triu)",
        ("dtype=torch.bool).tril()", "dtype=torch.bool).triu()"),
        (".tril(diagonal=num_cached)", ".triu(diagonal=num_cached)"),
    ),
    mistake(
        "no_mask",
        "ch17.1",
        "every query sees every key here; the keys after the query's own position (the future) must be hidden",
        ("dtype=torch.bool).tril()", "dtype=torch.bool)"),
    ),
    mistake(
        "prefix_hidden",
        "ch17.2",
        "the cached prefix is the same sequence's earlier tokens: every new query sees all num_cached cached keys",
    ),
    mistake(
        "one_ahead",
        "ch17.2",
        "off by one: key num_cached + i + 1 is the next token, the one query i predicts; it is still in the future",
        (".tril(diagonal=num_cached)", ".tril(diagonal=num_cached + 1)"),
    ),
    mistake(
        "additive",
        "ch17.1 ch17.2",
        "that is the additive form (0 where visible, −∞ where hidden) that scaled_dot_product_attention also "
        f"accepts; this course asks for the boolean form: {CONVENTION}",
    ),
    mistake(
        "float_values",
        "ch17.1 ch17.2",
        "your values are right, but not bool: scaled_dot_product_attention *adds* a float attn_mask to the "
        "scores (1 and 0 would be biases, nothing would be hidden); build the mask with dtype=torch.bool or "
        "call .bool()",
        ("torch.ones(num_tokens, num_tokens, dtype=torch.bool)", "torch.ones(num_tokens, num_tokens)"),
        ("torch.ones(num_new, num_cached + num_new, dtype=torch.bool)", "torch.ones(num_new, num_cached + num_new)"),
    ),
    mistake(
        "int_values",
        "ch17.1",
        "your values are right, but not bool: scaled_dot_product_attention refuses an integer attn_mask; build "
        "the mask with dtype=torch.bool or call .bool()",
        ("torch.ones(num_tokens, num_tokens, dtype=torch.bool)", "torch.ones(num_tokens, num_tokens, dtype=torch.int64)"),
    ),
    mistake(
        "new_keys_only",
        "ch17.2",
        "the keys are the num_cached cached tokens followed by the num_new new ones: num_cached + num_new columns",
        (
            "torch.ones(num_new, num_cached + num_new, dtype=torch.bool).tril(diagonal=num_cached)",
            "torch.ones(num_new, num_new, dtype=torch.bool).tril()",
        ),
    ),
    mistake(
        "every_row",
        "ch17.2",
        "one row per new query only: the cached tokens' queries were computed in an earlier step, only their K/V are reused",
        (
            "torch.ones(num_new, num_cached + num_new, dtype=torch.bool).tril(diagonal=num_cached)",
            "torch.ones(num_cached + num_new, num_cached + num_new, dtype=torch.bool).tril()",
        ),
    ),
    mistake(
        "cached_keys_only",
        "ch17.2",
        "the new tokens are keys too: each new query also sees the earlier new tokens and itself",
        (
            "torch.ones(num_new, num_cached + num_new, dtype=torch.bool).tril(diagonal=num_cached)",
            "torch.ones(num_new, num_cached, dtype=torch.bool)",
        ),
    ),
    mistake(
        "keys_by_queries",
        "ch17.2",
        "rows are the queries (num_new of them), columns the keys (num_cached + num_new)",
        (
            "torch.ones(num_new, num_cached + num_new, dtype=torch.bool).tril(diagonal=num_cached)",
            "torch.ones(num_new, num_cached + num_new, dtype=torch.bool).tril(diagonal=num_cached).T",
        ),
    ),
]
