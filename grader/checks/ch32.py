"""Public checks of ch32 · speculative decoding and determinism, and the messages they share with the hidden ones."""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from grader.checks import public
from grader.checks.ch23 import vec
from grader.compare import CheckFailed, describe, expect_int, expect_tensor, fmt
from grader.trial import Trial

CLAMP = 1e-10      # the race clamps its noise to ≥ 1e-10, as in ch23
NEAR = 1e-5        # a verdict u < p/q or a race this close (relative) to a tie may go either way

# The figure instance of ch32-spec-confidence: 5 drafts over a vocabulary of 6; the confidence of a
# draft is the largest probability of its draft distribution (a function of q_i, never of the token).
SPEC_TOKENS = [2, 4, 0, 5, 1]
SPEC_Q = [[0.05, 0.05, 0.70, 0.10, 0.05, 0.05], [0.02, 0.05, 0.03, 0.05, 0.80, 0.05],
          [0.60, 0.10, 0.10, 0.10, 0.05, 0.05], [0.10, 0.10, 0.10, 0.10, 0.10, 0.50],
          [0.10, 0.60, 0.10, 0.10, 0.05, 0.05]]
SPEC_P = [[0.05, 0.10, 0.60, 0.15, 0.05, 0.05], [0.05, 0.35, 0.05, 0.15, 0.30, 0.10],
          [0.50, 0.20, 0.10, 0.10, 0.05, 0.05], [0.10, 0.10, 0.20, 0.30, 0.20, 0.10],
          [0.05, 0.45, 0.20, 0.10, 0.10, 0.10], [0.20, 0.20, 0.15, 0.15, 0.15, 0.15]]
SPEC_U = [0.30, 0.62, 0.20, 0.50, 0.40]
SPEC_NOISE = [[1.0, 0.8, 1.3, 0.6, 2.0, 0.9], [1.2, 1.9, 0.5, 0.35, 0.2, 2.0], [0.7, 1.1, 0.4, 1.6, 0.9, 1.0],
              [0.9, 1.4, 0.3, 1.2, 0.8, 2.2], [1.1, 0.5, 0.9, 1.3, 0.6, 1.0], [0.8, 1.0, 1.2, 0.4, 1.5, 0.9]]
SPEC_CONF = [max(row) for row in SPEC_Q]          # 0.7, 0.8, 0.6, 0.5, 0.6
SPEC_THRESHOLD = 0.3                              # survivals 0.7, 0.56, 0.336 | 0.168, 0.1008 → 3 drafts


# -- 32.1: verification ---------------------------------------------------------------------------
@dataclass
class Case:
    """One verification: draft tokens [k], q [k, V], p [k + 1, V], uniforms [k], noise [k + 1, V]."""

    tokens: list[int]
    q: torch.Tensor
    p: torch.Tensor
    u: torch.Tensor
    e: torch.Tensor

    def args(self) -> tuple:
        return torch.tensor(self.tokens, dtype=torch.int64), self.q, self.p, self.u, self.e

    @property
    def k(self) -> int:
        return len(self.tokens)


def make_case(tokens, q, p, u, e, dtype=torch.float32) -> Case:
    """A Case from nested lists: probabilities in `dtype`, uniforms and noise in float32."""
    V = len(p[0])
    rows = lambda v, n, dt: torch.tensor(v, dtype=dt).reshape(n, V) if n else torch.zeros(0, V, dtype=dt)
    return Case(list(tokens), rows(q, len(tokens), dtype), rows(p, len(p), dtype),
                torch.tensor(u, dtype=torch.float32).reshape(-1), rows(e, len(e), torch.float32))


def race(weights: torch.Tensor, noise: torch.Tensor, clamp: bool = True) -> tuple[int, torch.Tensor]:
    """The exponential race in float64: (winner, weights / E)."""
    scores = weights.double() / (noise.double().clamp_min(CLAMP) if clamp else noise.double())
    return int(scores.argmax()), scores


def simulate(c: Case, accept: str = "ratio", recover: str = "residual", stop: bool = True, bonus: bool = True,
             shift: int = 0, bonus_row: int = 0, clamp: bool = True, keep_rejected: bool = False) -> list[int]:
    """Verification in float64, right (the defaults) or with one classic mistake, for the explanations."""
    p, q = c.p.double(), c.q.double()
    out = []
    for i, x in enumerate(c.tokens):
        px, qx, u = float(p[i, x]), float(q[i, x]), float(c.u[i])
        ok = {"ratio": qx > 0 and u < min(1.0, px / qx), "inverse": px > 0 and u < min(1.0, qx / px),
              "flipped": qx > 0 and u >= min(1.0, px / qx), "greedy": x == int(p[i].argmax()),
              "q0": qx == 0 or u < min(1.0, px / qx)}[accept]
        if ok:
            out.append(x)
            continue
        weights = {"residual": (p[i] - q[i]).clamp_min(0), "p": p[i], "reverse": (q[i] - p[i]).clamp_min(0)}
        if keep_rejected:
            out.append(x)
        if recover == "argmax":
            out.append(int(p[i].argmax()))
        else:
            out.append(race(weights[recover], c.e[min(i + shift, c.k)], clamp)[0])
        if stop:
            return out
    if bonus:
        out.append(race(p[c.k - bonus_row], c.e[c.k - bonus_row], clamp)[0])
    return out


VARIANTS = [  # (how the tokens were made, simulate's keywords, hint)
    ("no bonus", {"bonus": False}, "when all k drafts are accepted, add the bonus token drawn from target_probs[k] "
                                   "with noise[k]: a verification emits accepted + 1 tokens"),
    ("no stop", {"stop": False}, "stop at the first rejection: the later drafts were drafted after the rejected "
                                 "token, which is not in the output"),
    ("rejected draft kept", {"keep_rejected": True}, "a rejected draft is not emitted: the recovered token takes "
                                                     "its place"),
    ("replacement from p", {"recover": "p"},
     "at a rejection draw from max(0, p − q) renormalised, not from p: the drafter already offers some tokens "
     "too often, and only the mass it misses may be added back (else the output is not distributed as p)"),
    ("residual q − p", {"recover": "reverse"}, "the recovered token comes from max(0, p − q): target minus draft"),
    ("ratio q/p", {"accept": "inverse"}, "accept with probability min(1, p(x) / q(x)): target over draft"),
    ("accept when u ≥ p/q", {"accept": "flipped"}, "accept when u < min(1, p(x) / q(x)): a small u accepts"),
    ("greedy", {"accept": "greedy", "recover": "argmax"},
     "that is greedy verification (accept while the draft equals argmax p); a sampled request accepts when "
     "u < min(1, p(x) / q(x)) and draws the rest with the noise"),
    ("next noise row", {"shift": 1}, "the race at position i uses noise[i]"),
    ("bonus from row k − 1", {"bonus_row": 1}, "the bonus token comes from target_probs[k] with noise[k], the "
                                               "target's distribution after the last draft"),
    ("unclamped noise", {"clamp": False}, "clamp the noise to ≥ 1e-10 as in ch23: with E = 0, a zero weight gives "
                                          "0 / 0 = NaN, which argmax picks"),
    ("q(x) = 0 accepted", {"accept": "q0"}, "a draft with q(x) = 0 could not have been drafted: reject it (vLLM "
                                            "does, since p(x) / q(x) is undefined)"),
]


def variant_hint(c: Case, tokens: list[int], want: list[int]) -> str:
    for _, kw, hint in VARIANTS:
        alt = simulate(c, **kw)
        if alt == tokens and alt != want:
            return hint
    return ""


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= NEAR * max(abs(a), abs(b), 1e-30)


def race_ok(weights: torch.Tensor, noise: torch.Tensor, y: int) -> bool:
    """Whether token y wins the race (or ties with the winner within NEAR)."""
    if not 0 <= y < weights.numel():
        return False
    best, scores = race(weights, noise)
    return float(scores[y]) > 0 and float(scores[y]) >= float(scores[best]) * (1 - NEAR) or y == best


def first_problem(c: Case, got: list[int]) -> int | None:
    """The first position where `got` is not a verification of c (near-ties allowed either way); None if valid."""
    p, q = c.p.double(), c.q.double()
    for i, y in enumerate(got):
        last = i == len(got) - 1
        if i == c.k:
            return None if race_ok(p[i], c.e[i], y) else i
        x, u = c.tokens[i], float(c.u[i])
        px, qx = float(p[i, x]), float(q[i, x])
        ratio = min(1.0, px / qx) if qx > 0 else 0.0
        accept, near = u < ratio, _near(u, ratio) and qx > 0
        if not last and not (y == x and (accept or near)):
            return i
        if last and not ((not accept or near) and race_ok((p[i] - q[i]).clamp_min(0), c.e[i], y)):
            return i
    return None


def describe_position(c: Case, i: int) -> tuple[str, int]:
    """What verification does at position i (exactly, in float64), and the token it emits there."""
    p, q = c.p.double(), c.q.double()
    if i >= c.k:
        w, scores = race(p[c.k], c.e[c.k])
        return (f"all {c.k} drafts were accepted, so the bonus token is the race on target_probs[{c.k}] = "
                f"{vec(p[c.k])} with noise[{c.k}] = {vec(c.e[c.k])}: p / E = {vec(scores)} → token {w}", w)
    x, u = c.tokens[i], float(c.u[i])
    px, qx = float(p[i, x]), float(q[i, x])
    head = f"position {i}: draft token {x}, q_{i}({x}) = {fmt(qx)}, p_{i}({x}) = {fmt(px)}"
    if qx > 0 and u < min(1.0, px / qx):
        return f"{head}, u_{i} = {fmt(u)} < min(1, p/q) = {fmt(min(1.0, px / qx))} → accepted: emit {x} and go on", -1
    verdict = (f"u_{i} = {fmt(u)} ≥ min(1, p/q) = {fmt(min(1.0, px / qx))}" if qx > 0 else "q(x) = 0") + " → rejected"
    residual = (p[i] - q[i]).clamp_min(0)
    w, scores = race(residual, c.e[i])
    return (f"{head}, {verdict}; the recovered token is the race on max(0, p_{i} − q_{i}) = {vec(residual)} with "
            f"noise[{i}] = {vec(c.e[i])}: scores {vec(scores)} → token {w}, and verification stops", w)


def expect_emitted(got, c: Case, want: list[int], *, case: str) -> list[int]:
    """Require the student's emitted tokens to be a verification of c; explain the first wrong position."""
    V = c.p.shape[1]
    if type(got) not in (list, tuple) or any(type(y) is not int for y in got):
        raise CheckFailed(f"{case}\nexpected the emitted tokens as a list of Python ints; yours: {describe(got)}"
                          + ("  (use .tolist())" if isinstance(got, torch.Tensor) else ""))
    tokens = list(got)
    if tokens == want:
        return tokens
    i, problem = None, ""
    if not 1 <= len(tokens) <= c.k + 1:
        problem = (f"{len(tokens)} tokens, but a verification of k = {c.k} drafts emits "
                   + ("exactly 1 (the bonus)" if c.k == 0 else f"1 … {c.k + 1}"))
    elif any(not 0 <= y < V for y in tokens):
        problem = f"token {next(y for y in tokens if not 0 <= y < V)} is outside the vocabulary 0 … {V - 1}"
    else:
        i = first_problem(c, tokens)
        if i is None:
            return tokens
    lines = [case, f"expected {want}; yours {tokens}" + (f": {problem}" if problem else "")]
    if i is not None:
        text, w = describe_position(c, i)
        y, rest = tokens[i], len(tokens) - i - 1
        if w >= 0 and y != w:
            weights = c.p[i].double() if i >= c.k else (c.p[i].double() - c.q[i].double()).clamp_min(0)
            zero = f" (its weight {'p' if i >= c.k else 'max(0, p − q)'} is 0: it can never win)" \
                if float(weights[y]) == 0 else ""
            if i < c.k and y == c.tokens[i] and rest:
                zero = " (you accepted the draft)"
            text += f"; yours: token {y}{zero}" + (f", then {rest} more" if rest else "")
        elif w >= 0:
            text += f"; yours: token {y}, then {rest} more"
        else:
            text += f"; yours: token {y}" if y != c.tokens[i] else "; yours: your list ends there"
        lines.append(text)
    return _raise(lines, variant_hint(c, tokens, want))


def _raise(lines: list[str], hint: str):
    raise CheckFailed("\n".join(lines + ([f"hint: {hint}"] if hint else [])))


def run_verify(t: Trial, c: Case, *, case: str) -> list[int]:
    got = t.call("verify_draft", *c.args())
    want = t.ref.verify_draft(*c.args())
    return expect_emitted(got, c, want, case=f"{case} (k = {c.k}, V = {c.p.shape[1]})")


# -- 32.2: how many drafts to verify ----------------------------------------------------------------
def survivals(conf: list[float]) -> list[float]:
    out, s = [], 1.0
    for c in conf:
        s *= c
        out.append(s)
    return out


def expect_count(got, conf: list[float], threshold: float, want: int, *, case: str) -> int:
    n = expect_int(got, what="the number of drafts to verify")
    if n == want:
        return n
    k, surv = len(conf), survivals(conf)
    lines = [case, f"confidences {vec(conf, limit=10)}, threshold {fmt(threshold)}",
             "survival = running product: " + ", ".join(f"s{j} = {fmt(s)}" for j, s in enumerate(surv[:10]))
             + (", …" if k > 10 else "")]
    if want < k:
        lines.append(f"s{want} = {fmt(surv[want])} < {fmt(threshold)} is the first survival below the threshold, "
                     f"so n = {want}; yours: {n}")
    else:
        lines.append(f"every survival stays ≥ {fmt(threshold)}, so all {k} drafts are verified; yours: {n}")
    alone = next((j for j, c in enumerate(conf) if c < threshold), k)
    hint = ""
    if n in (alone, sum(c >= threshold for c in conf)) and n != want:
        hint = ("the survival of draft j is the product c0 · … · cj, not cj on its own: a confident late draft "
                "cannot rescue a weak prefix")
    elif n == next((j for j, s in enumerate(surv) if s <= threshold), k) and n < want:
        hint = "a survival equal to the threshold still counts (≥)"
    elif n == want + 1:
        hint = "n counts the drafts whose survival is ≥ threshold: the first draft below it is not sent"
    return _raise(lines, hint)


def run_count(t: Trial, conf, threshold: float, *, case: str) -> int:
    got = t.call("num_drafts_to_verify", conf, threshold)
    want = t.ref.num_drafts_to_verify(conf, threshold)
    values = conf.double().tolist() if isinstance(conf, torch.Tensor) else list(conf)
    return expect_count(got, values, threshold, want, case=case)


# -- 32.3: batch invariance ---------------------------------------------------------------------------
INT_OF = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
          torch.float16: torch.int16}
UNIT = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
FIG_K, FIG_N, FIG_BATCHES = 256, 64, [1, 2, 3, 4, 8, 16, 32, 64]
PROBE_SHAPES = [(torch.float32, 64, 64), (torch.float32, 256, 128), (torch.float32, 1024, 64),
                (torch.bfloat16, 256, 128), (torch.float64, 256, 128)]


def bits(v: torch.Tensor) -> str:
    """A float's bit pattern in hex (0x3F800000 for float32 1.0)."""
    n = {torch.float64: 16, torch.float32: 8}.get(v.dtype, 4)
    return f"0x{int(v.reshape(1).view(INT_OF[v.dtype])) & ((1 << 4 * n) - 1):0{n}X}"


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.contiguous().view(INT_OF[a.dtype]) == b.contiguous().view(INT_OF[b.dtype])


def probe_matmul(gen: torch.Generator, batches: list[int] = FIG_BATCHES) -> list[dict]:
    """Measured here: for each dtype and shape, the batch sizes at which plain x @ w gives row 0 other bits than
    at B = 1 (an empty list: none found on this machine for that shape)."""
    found = []
    for dtype, K, N in PROBE_SHAPES:
        x = torch.randn(max(batches), K, generator=gen).to(dtype)
        w = torch.randn(K, N, generator=gen).to(dtype)
        alone = (x[:1] @ w)[0]
        found.append({"dtype": str(dtype).removeprefix("torch."), "K": K, "N": N,
                      "changed": [B for B in batches if not bool(same_bits((x[:B] @ w)[0], alone).all())]})
    return found


def machine() -> str:
    return f"{platform.machine() or 'cpu'}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def expect_product(got, x: torch.Tensor, w: torch.Tensor, *, case: str) -> torch.Tensor:
    """Require x @ w within the rounding of a float32 (float64) accumulation and a cast to x's dtype."""
    B, K, N = x.shape[0], x.shape[1], w.shape[1]
    out = expect_tensor(got, what=f"x @ w for a batch of {B} rows", shape=[B, N], dtype=x.dtype)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    exact = x.double() @ w.double()
    bound = 2 * K * UNIT[acc] * (x.double().abs() @ w.double().abs()) + 2 * UNIT[x.dtype] * exact.abs() + 1e-30
    bad = ~((out.double() - exact).abs() <= bound)
    if not bool(bad.any()):
        return out
    i, n = (int(v) for v in bad.nonzero()[0])
    lines = [case, f"out[{i}, {n}] = Σ_k x[{i}, k] · w[k, {n}] over K = {K} terms = {fmt(float(exact[i, n]), 8)} "
                   f"(float64), allowed error {fmt(float(bound[i, n]), 2)}; yours: {fmt(float(out[i, n]), 8)} "
                   f"({int(bad.sum())} of {bad.numel()} entries are off)"]
    hint = ""
    if x.dtype in (torch.bfloat16, torch.float16):
        low = torch.zeros(B, N, dtype=x.dtype)
        for k in range(K):
            low = low + x[:, k:k + 1] * w[k]
        if bool((low == out).float().mean() > 0.9):
            hint = f"accumulate in float32 and cast the result to {str(x.dtype)[6:]} once at the end"
    return _raise(lines, hint)


def collect(t: Trial, pool: torch.Tensor, w: torch.Tensor, batches: list[list[int]]) -> list[torch.Tensor]:
    """The student's outputs for batches of pool rows, shape and dtype checked."""
    return [expect_tensor(t.call("batch_invariant_matmul", pool[idx], w), what=f"x @ w for a batch of {len(idx)} rows",
                          shape=[len(idx), w.shape[1]], dtype=pool.dtype) for idx in batches]


def expect_invariant(outs: list[torch.Tensor], pool: torch.Tensor, w: torch.Tensor, batches: list[list[int]], *,
                     case: str) -> None:
    """Values close to x @ w, and each pool row with the same bits wherever it appears (batch size, position,
    neighbours)."""
    for idx, out in zip(batches, outs):
        expect_product(out, pool[idx], w, case=f"{case}, batch of B = {len(idx)}")
    first: dict[int, tuple[int, int, torch.Tensor, torch.Tensor]] = {}
    for idx, out in zip(batches, outs):
        for pos, r in enumerate(idx):
            if r not in first:
                first[r] = (len(idx), pos, out, pool[idx])
                continue
            B0, pos0, out0, x0 = first[r]
            same = same_bits(out[pos], out0[pos0])
            if bool(same.all()):
                continue
            n = int((~same).nonzero()[0])
            a, b = out0[pos0, n], out[pos, n]
            ulps = abs(int(a.reshape(1).view(INT_OF[a.dtype])) - int(b.reshape(1).view(INT_OF[b.dtype])))
            lines = [case,
                     f"pool row {r} computed in a batch of B = {B0} (position {pos0}) and of B = {len(idx)} "
                     f"(position {pos}) must come out with the same bits; column {n}: {fmt(float(a), 9)} ({bits(a)}) "
                     f"vs {fmt(float(b), 9)} ({bits(b)}), {ulps} ulp apart; {int((~same).sum())} of {same.numel()} "
                     f"columns differ",
                     "the order in which your function sums over k depends on the batch"]
            plain = bool(same_bits(out, pool[idx] @ w).all()) and bool(same_bits(out0, x0 @ w).all())
            _raise(lines, f"your rows are plain x @ w's: on this machine the matmul kernel sums a row differently in "
                          f"a batch of {B0} and of {len(idx)} rows; sum over k in one fixed order that never depends "
                          f"on B" if plain else
                          "nothing in a row's reduction may depend on the batch: not the number of rows (a split "
                          "chosen by B), not the row's position, not the other rows")


def run_invariance(t: Trial, pool: torch.Tensor, w: torch.Tensor, batches: list[list[int]], *, case: str) -> None:
    expect_invariant(collect(t, pool, w, batches), pool, w, batches, case=case)


# -- public checks of 32.1 ------------------------------------------------------------------------------
def spec_case(n: int) -> Case:
    """The figure instance cut to its first n drafts (and n + 1 target rows)."""
    return make_case(SPEC_TOKENS[:n], SPEC_Q[:n], SPEC_P[:n + 1], SPEC_U[:n], SPEC_NOISE[:n + 1])


@public("32.1", "figure instance: the 3 drafts sent for verification, 1 accepted, 1 rejected")
def spec_instance(t: Trial) -> None:
    n = t.ref.num_drafts_to_verify(SPEC_CONF, SPEC_THRESHOLD)
    c = spec_case(n)
    got = t.call("verify_draft", *c.args())
    want = t.ref.verify_draft(*c.args())
    if type(got) in (list, tuple) and all(type(y) is int for y in got):
        p, q = c.p.double(), c.q.double()
        rows = [(float(q[i, x]), float(p[i, x]), float(c.u[i])) for i, x in enumerate(c.tokens)]
        stop = next((i for i, (qx, px, u) in enumerate(rows) if not u < min(1.0, px / qx)), c.k)
        weights = (p[stop] - q[stop]).clamp_min(0) if stop < c.k else p[c.k]
        t.figure("ch32-spec-confidence", tokens=SPEC_TOKENS, verified=n, q_x=[r[0] for r in rows],
                 p_x=[r[1] for r in rows], u=[r[2] for r in rows], stop=stop, race_p=p[stop],
                 race_q=q[stop] if stop < c.k else None, race_weights=weights, race_noise=c.e[stop],
                 race_scores=race(weights, c.e[stop])[1], emitted=list(got), emitted_expected=want)
    expect_emitted(got, c, want, case=f'case "figure instance": drafts {c.tokens}, uniforms {SPEC_U[:n]}')


@public("32.1", "the worked example of vLLM's rejection sampler: q = (0.6, 0.3, 0.1), p = (0.3, 0.5, 0.2)")
def worked_example(t: Trial) -> None:
    # Draft A (token 0): accepted with probability min(1, 0.3 / 0.6) = 0.5. u = 0.4 accepts it and the bonus
    # follows; u = 0.7 rejects it, and max(0, p − q) = (0, 0.2, 0.1) races with the noise (0.2, 1.5, 0.6).
    for u in (0.4, 0.7):
        c = make_case([0], [[0.6, 0.3, 0.1]], [[0.3, 0.5, 0.2], [0.2, 0.2, 0.6]], [u],
                      [[0.2, 1.5, 0.6], [1.3, 0.4, 0.9]])
        run_verify(t, c, case=f'case "worked example": draft A = token 0, u = {u}')


@public("32.1", "all k drafts accepted: k + 1 tokens, the bonus from target_probs[k] with noise[k]")
def all_accepted(t: Trial) -> None:
    c = make_case([1, 3, 0], [[0.2, 0.5, 0.2, 0.1], [0.1, 0.1, 0.2, 0.6], [0.4, 0.3, 0.2, 0.1]],
                  [[0.1, 0.6, 0.2, 0.1], [0.1, 0.2, 0.1, 0.6], [0.5, 0.2, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]],
                  [0.1, 0.9, 0.3], [[1.0] * 4, [1.0] * 4, [1.0] * 4, [0.3, 2.0, 0.5, 1.9]])
    run_verify(t, c, case='case "all accepted": every u < min(1, p/q)')


@public("32.1", "q = p: every draft is accepted, even with u = 0.999")
def same_distributions(t: Trial) -> None:
    p = [[0.25, 0.25, 0.5], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]
    c = make_case([2, 1], p[:2], p, [0.999, 0.999], [[1.0, 0.5, 2.0], [0.5, 1.0, 1.0], [2.0, 0.3, 1.0]])
    run_verify(t, c, case='case "q = p": p(x) / q(x) = 1 > u')


@public("32.1", "target_probs with k rows instead of k + 1 raises ValueError")
def missing_bonus_row(t: Trial) -> None:
    q = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    t.expect_raises(ValueError, "verify_draft", torch.tensor([0, 1]), q, q.clone(), torch.tensor([0.1, 0.2]),
                    torch.ones(3, 2), because="k = 2 drafts need k + 1 = 3 target rows (the last for the bonus)")


# -- public checks of 32.2 ------------------------------------------------------------------------------
@public("32.2", "figure instance: confidences 0.7, 0.8, 0.6, 0.5, 0.6 with threshold 0.3")
def count_instance(t: Trial) -> None:
    conf = torch.tensor(SPEC_CONF)
    got = t.call("num_drafts_to_verify", conf, SPEC_THRESHOLD)
    want = t.ref.num_drafts_to_verify(conf, SPEC_THRESHOLD)
    n = expect_int(got, what="the number of drafts to verify")
    t.figure("ch32-spec-confidence", confidences=conf.double(), threshold=SPEC_THRESHOLD,
             survivals=survivals(conf.double().tolist()), n=n, n_expected=want)
    expect_count(n, conf.double().tolist(), SPEC_THRESHOLD, want, case='case "figure instance"')


@public("32.2", "the adaptive-verification example: R1 = (0.9, 0.8, 0.5), R2 = (0.6, 0.5, 0.9), threshold 0.35")
def two_requests(t: Trial) -> None:
    run_count(t, [0.9, 0.8, 0.5], 0.35, case='case "R1": survivals 0.9, 0.72, 0.36')
    run_count(t, [0.6, 0.5, 0.9], 0.35, case='case "R2": survivals 0.6, 0.30, 0.27 (the 0.9 comes too late)')


@public("32.2", "a survival exactly equal to the threshold is still verified")
def equal_threshold(t: Trial) -> None:
    run_count(t, torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64), 0.25,
              case='case "equal": survivals 0.5, 0.25, 0.125 (exact in binary), threshold 0.25')


@public("32.2", "no drafts, and a first draft below the threshold: nothing to verify")
def nothing_to_verify(t: Trial) -> None:
    run_count(t, torch.zeros(0), 0.5, case='case "k = 0"')
    run_count(t, torch.tensor([0.2, 1.0, 1.0]), 0.5, case='case "weak first draft": c0 = 0.2 < 0.5')


@public("32.2", "a confidence above 1 raises ValueError")
def bad_confidence(t: Trial) -> None:
    t.expect_raises(ValueError, "num_drafts_to_verify", torch.tensor([0.9, 1.2]), 0.5,
                    because="a confidence is a probability in [0, 1]; 1.2 is not")


# -- public checks of 32.3 ------------------------------------------------------------------------------
@public("32.3", f"figure instance: row 0 in batches of {FIG_BATCHES[0]} … {FIG_BATCHES[-1]}, beside plain x @ w")
def determinism_instance(t: Trial) -> None:
    x = torch.randn(max(FIG_BATCHES), FIG_K, generator=t.rng)
    w = torch.randn(FIG_K, FIG_N, generator=t.rng)
    batches = [list(range(B)) for B in FIG_BATCHES]
    outs = collect(t, x, w, batches)
    mine, plain = [o[0] for o in outs], [(x[:B] @ w)[0] for B in FIG_BATCHES]
    differ = lambda rows: [int((~same_bits(r, rows[0])).sum()) for r in rows]
    first_col = lambda rows: next((int((~same_bits(r, rows[0])).nonzero()[0]) for r in rows
                                   if not bool(same_bits(r, rows[0]).all())), None)
    col = next((c for c in (first_col(mine), first_col(plain)) if c is not None), 0)
    t.figure("ch32-determinism", K=FIG_K, N=FIG_N, batches=FIG_BATCHES, column=col,
             yours=[float(r[col]) for r in mine], yours_bits=[bits(r[col]) for r in mine], yours_changed=differ(mine),
             plain=[float(r[col]) for r in plain], plain_bits=[bits(r[col]) for r in plain],
             plain_changed=differ(plain),
             exact=float((x[0].double() @ w.double())[col]), probe=probe_matmul(t.rng), machine=machine())
    expect_invariant(outs, x, w, batches, case=f'case "figure instance": row 0 of x [64, {FIG_K}], w [{FIG_K}, '
                                               f'{FIG_N}], in batches of B = {FIG_BATCHES}')


@public("32.3", "a row keeps its bits at any position, beside any neighbours")
def any_position(t: Trial) -> None:
    pool, w = torch.randn(12, 96, generator=t.rng), torch.randn(96, 40, generator=t.rng)
    batches = [[0], [3, 0], [5, 1, 0, 7], [11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0], [0, 0, 0, 4, 4], [4], [7, 3, 11]]
    run_invariance(t, pool, w, batches, case='case "positions": 12 rows of K = 96, N = 40, shuffled into 7 batches')


@public("32.3", "agrees with x @ w up to float32 rounding, K = 1 and odd sizes included")
def agrees(t: Trial) -> None:
    for B, K, N in ((3, 5, 7), (1, 1, 4), (9, 130, 33), (0, 8, 3)):
        x, w = torch.randn(B, K, generator=t.rng), torch.randn(K, N, generator=t.rng)
        expect_product(t.call("batch_invariant_matmul", x, w), x, w, case=f'case "agrees": B = {B}, K = {K}, N = {N}')


@public("32.3", "bfloat16 in, bfloat16 out, summed in float32")
def bf16(t: Trial) -> None:
    x = torch.randn(6, 512, generator=t.rng).to(torch.bfloat16)
    w = (torch.randn(512, 24, generator=t.rng) * 0.05).to(torch.bfloat16)
    expect_product(t.call("batch_invariant_matmul", x, w), x, w, case='case "bfloat16": B = 6, K = 512, N = 24')


@public("32.3", "mismatched inner dimensions raise ValueError")
def bad_shapes(t: Trial) -> None:
    t.expect_raises(ValueError, "batch_invariant_matmul", torch.ones(2, 3), torch.ones(4, 5),
                    because="x is [2, 3] and w is [4, 5]: x's K = 3 differs from w's K = 4")
