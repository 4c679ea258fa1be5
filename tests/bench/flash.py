"""Benchmark (not a test): the reference naive_attention vs flash_attention of ch22 on CPU.

Run:  .venv/bin/python tests/bench/flash.py [--sizes 1024 2048 4096 8192] [--d 64] [--block 64]

One head, T = S (a causal prefill), float32, one thread (torch.set_num_threads(1), so the
numbers do not depend on what else the machine runs). Every (implementation, T) runs in a
fresh subprocess, so one run's allocations cannot hide in another's. What is measured:

- peak RSS growth: the process's resident memory high-water mark during the call minus its
  resident memory just before it (the high-water mark is reset first through
  /proc/self/clear_refs, so an earlier peak, e.g. from importing torch, cannot mask it). This
  is what the operating system saw: every tensor the call allocated and touched, including
  the outputs ([T, d] for both; naive_attention also returns its [T, S] intermediates).
- fits the check: whether the call fits in its inputs plus the spare memory the hidden "no T·S
  tensor" check allows (grader.hidden.ch22.FLASH_SPARE), measured as that check measures it, in
  yet another fresh process: its address space capped (RLIMIT_AS) at its size plus that budget,
  the inputs made after the cap. "no" when torch or Python was refused memory.
- time: wall time of one call after a small warm-up call; the median of 3 calls for T ≤ 2048.

The reference flash_attention is a Python loop over tiles (a model of the algorithm, not a
kernel): its time is dominated by per-tile interpreter overhead and small matmuls, so the
time column says little about FlashAttention on a GPU; the memory columns are the point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402

SIZES = [1024, 2048, 4096, 8192]
"""T of the default run: the [T, T] float32 scores grow from 4 MiB to 256 MiB."""


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def inputs(T: int, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of one head: [T, d] float32 each, standard normal (seed 0)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(T, d, generator=g) for _ in range(3))
    return q, k, v


def attention(impl: str, block: int) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]:
    """The reference's causal `naive` attention, or its `flash` attention with block × block tiles."""
    from solutions import ch22_flash_attention as ref

    if impl == "naive":
        return lambda q, k, v: ref.naive_attention(q, k, v, causal=True)
    return lambda q, k, v: ref.flash_attention(q, k, v, causal=True, block_q=block, block_k=block)


def budget(T: int, d: int) -> int:
    """Bytes the hidden "no T·S tensor" check lets a call have: its inputs (q, k, v in float32) plus FLASH_SPARE."""
    from grader.hidden.ch22 import FLASH_SPARE

    return 3 * T * d * 4 + FLASH_SPARE


def one(impl: str, T: int, d: int, block: int) -> dict:
    """Measure one implementation at one size (runs in its own process)."""
    torch.set_num_threads(1)
    q, k, v = inputs(T, d)
    fn = attention(impl, block)
    fn(q[:block], k[:block], v[:block])  # warm-up: lazy initialisation

    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    start = time.perf_counter()
    result = fn(q, k, v)
    times = [time.perf_counter() - start]
    peak = _status("VmHWM") - before
    del result
    for _ in range(2 if T <= 2048 else 0):
        start = time.perf_counter()
        fn(q, k, v)
        times.append(time.perf_counter() - start)

    return {"impl": impl, "T": T, "d": d, "peak_rss": peak, "time": statistics.median(times), "runs": len(times)}


def fits(impl: str, T: int, d: int, block: int) -> dict:
    """Whether one call fits in its inputs plus FLASH_SPARE (runs in its own process, capped as the check caps it)."""
    import resource

    from grader.hidden.ch22 import FLASH_SPARE

    torch.set_num_threads(1)
    fn = attention(impl, block)  # imported before the cap
    cap = _status("VmSize") + budget(T, d)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        fn(*inputs(T, d))
        ok = True
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "memory" not in str(e):
            raise
        ok = False
    return {"fits": ok, "spare": FLASH_SPARE}


def measured(kind: str, impl: str, T: int, args: argparse.Namespace) -> dict:
    """`one` or `fits` of (impl, T), run in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, __file__, f"--{kind}", impl, str(T), "--d", str(args.d), "--block", str(args.block)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def mib(x: float) -> str:
    return f"{x / 2**20:,.1f} MiB" if x >= 2**20 else f"{x / 2**10:,.0f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--block", type=int, default=64, help="block_q = block_k of flash_attention")
    parser.add_argument("--one", nargs=2, metavar=("IMPL", "T"), help=argparse.SUPPRESS)
    parser.add_argument("--fits", nargs=2, metavar=("IMPL", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one or args.fits:
        measure, (impl, T) = (one, args.one) if args.one else (fits, args.fits)
        print(json.dumps(measure(impl, int(T), args.d, args.block)))
        return
    print(f"one head, T = S, d = {args.d}, float32, causal, CPU, 1 thread; flash tiles {args.block} × {args.block}")
    print(f"{'T':>6}  {'impl':<6} {'peak RSS growth':>16} {'fits the check':>15} {'[T,S] fp32':>11} {'time':>9}")
    for T in args.sizes:
        for impl in ("naive", "flash"):
            r, f = (measured(kind, impl, T, args) for kind in ("one", "fits"))
            verdict = f"{'yes' if f['fits'] else 'no'} (+{mib(f['spare'])})"
            print(
                f"{T:>6}  {impl:<6} {mib(r['peak_rss']):>16} {verdict:>15} {mib(4 * T * T):>11} "
                f"{r['time']:>8.2f}s" + (f"  (median of {r['runs']})" if r["runs"] > 1 else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
