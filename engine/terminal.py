"""`course engine run` on a terminal: reading the prompts, a progress display, the summary, the figure."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import click

from engine.core import Run
from engine.model import Model
from engine.text import Text, load_text
from grader.delivery import escape
from grader.i18n import tr

if TYPE_CHECKING:
    from click._termui_impl import ProgressBar


def read_prompts(path: Path) -> list[list[int]] | list[str]:
    """A JSON list of token-id lists, or a JSON list of texts (click.BadParameter otherwise)."""
    try:
        prompts = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise click.BadParameter(tr("{path} is not a JSON file: {error}", path=path, error=e), param_hint="--prompts") from None
    if isinstance(prompts, list) and prompts and all(isinstance(p, str) and p for p in prompts):
        return prompts
    if (
        not isinstance(prompts, list)
        or not prompts
        or not all(isinstance(p, list) and p and all(type(t) is int for t in p) for p in prompts)
    ):
        raise click.BadParameter(
            tr(
                "{path} must hold a non-empty JSON list of non-empty token-id lists, e.g. [[1, 2, 3], [1, 2, 4]], or of texts, "
                'e.g. ["The KV cache", "Paged attention"]',
                path=path,
            ),
            param_hint="--prompts",
        )
    return prompts


def encode_prompts(prompts: list[list[int]] | list[str], text: Text | None, model_name: str) -> list[list[int]]:
    """Token ids for the engine: texts through the model's tokenizer, id lists as they are.

    Raises:
        ModelError: texts for a model without a tokenizer.json (`engine.text.load_text` says which file is missing).
        click.UsageError: a text that encodes to no token at all.
    """
    if not prompts or not isinstance(prompts[0], str):
        return [list(p) for p in prompts if not isinstance(p, str)]
    if text is None:
        text = load_text(model_name)  # raises, naming the missing tokenizer.json
    ids = [text.encode(p) for p in prompts if isinstance(p, str)]
    for prompt, encoded in zip(prompts, ids):
        if not encoded:
            raise click.UsageError(tr("the prompt {prompt} encodes to no token", prompt=repr(prompt)))
    return ids


def texts(result: Run, prompts: list[list[int]], text: Text) -> list[dict[str, str]]:
    """Each request's prompt and completion as text ({"prompt", "completion"}), special tokens left out."""
    return [{"prompt": text.decode(p), "completion": text.completion(p, out)} for p, out in zip(prompts, result.outputs)]


class _Progress:
    """Which chapter's checks run, then a bar of generated tokens (on stderr, so stdout stays clean)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: ProgressBar[int] | None = None

    def chapter(self, chapter_id: str) -> None:
        if self.enabled:
            click.echo("\r" + tr("checking your {chapter} (public checks) …", chapter=chapter_id), nl=False, err=True)

    def step(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            click.echo("\r" + " " * 48 + "\r", nl=False, err=True)
            self.bar = click.progressbar(length=total, label=tr("generating"), file=sys.stderr, show_pos=True)
            self.bar.__enter__()
        self.bar.update(done - self.bar.pos)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)


@contextmanager
def progress(*, enabled: bool) -> Iterator[_Progress]:
    shown = _Progress(enabled)
    try:
        yield shown
    finally:
        shown.close()


def draw_overview(result: Run, model: Model, folder: Path, *, prompt_text: str | None = None, output_text: str | None = None) -> str | None:
    """Write the course overview figure of this run to folder/engine/overview.svg; None if it cannot be drawn. With a
    tokenizer, the traced request's prompt and completion as text (decoded on the trusted side)."""
    import figures
    from engine import overview_record

    (spec,) = figures.catalog("overview")
    try:
        record = overview_record(result, model)
        if output_text is not None:
            record["prompt_text"], record["output_text"] = prompt_text or "", output_text
        svg = spec.render(record)
    except Exception as e:  # noqa: BLE001 (a drawing error never hides the run)
        result.notes.append(tr("overview figure not drawn ({error})", error=f"{type(e).__name__}: {e}"))
        return None
    from grader.delivery.files import Folder

    try:
        with Folder.open(Path(folder), "engine") as out:  # no link followed below `folder`
            return str(out.write("overview.svg", svg))
    except OSError as e:
        result.notes.append(tr("overview figure not written ({error})", error=e.strerror or e))
        return None


def summary(result: Run, prompts: list[list[int]], figure: str | None, text: Text | None = None) -> str:
    """The run for a person: outputs (as text where the model has a tokenizer, else token ids), whose code ran, the
    counts and the latency metrics."""
    m = result.metrics
    lines = [click.style(tr("engine · {model}", model=escape.terminal(result.model)), bold=True)]
    for i, (prompt, out) in enumerate(zip(prompts, result.outputs)):
        if text is None:
            lines.append("  " + tr("request {i}  prompt {n:>3} tokens → {ids}", i=i, n=len(prompt), ids=out))
            continue
        ended = text.eos_token_id is not None and out[-1:] == [text.eos_token_id]
        lines.append(
            "  "
            + tr("request {i}  prompt {n:>3} tokens → {m} tokens", i=i, n=len(prompt), m=len(out))
            + (" " + tr("(ended by EOS)") if ended else "")
        )
        lines += [("    " + line if line else "") for line in _continued(text.decode(prompt), text.completion(prompt, out))]
    yours = [label for label, source in result.sources.items() if source == "yours"]
    if yours:
        lines.append(tr("your code: {labels}", labels=", ".join(yours)))
    else:
        lines.append(tr("your code: none (every stage ran the reference)"))
    if yours and len(yours) < len(result.sources):
        lines.append(tr("reference: {labels}", labels=", ".join(label for label, s in result.sources.items() if s != "yours")))
    lines += [f"  · {note}" for note in result.notes]
    called = sorted({label[:4] for label, n in result.calls.items() if n})
    if result.calls:
        lines.append(tr("chapters called: {n} of 18 ({chapters})", n=len(called), chapters=" ".join(called)))
    lines.append(
        tr(
            "steps {steps} ({prefill} prefill, {decode} decode) · chunked prefill steps {chunked} · prefix-cache hits "
            "{hits} ({cached} tokens) · preemptions {preemptions}",
            steps=m["steps"],
            prefill=m["prefill_steps"],
            decode=m["decode_steps"],
            chunked=m["chunked_prefill_steps"],
            hits=m["prefix_cache_hits"],
            cached=m["prefix_cached_tokens"],
            preemptions=m["preemptions"],
        )
    )
    if m.get("draft_tokens"):
        lines.append(
            tr(
                "speculative decoding: {accepted} of {drafts} drafts accepted in {steps} steps",
                accepted=m["accepted_tokens"],
                drafts=m["draft_tokens"],
                steps=m["speculative_steps"],
            )
        )
    if m.get("moe_ep_ranks"):
        lines.append(
            tr(
                "experts: {slots} slots on {ranks} ranks · EPLB rebalanced {n} times · balancedness {before:.2f} → {after:.2f}",
                slots=m["moe_physical_experts"],
                ranks=m["moe_ep_ranks"],
                n=m.get("eplb_rebalances", 0),
                before=m.get("moe_balancedness_before") or m.get("moe_balancedness") or 0.0,
                after=m.get("moe_balancedness_after") or m.get("moe_balancedness") or 0.0,
            )
        )
    lines.append(
        tr(
            "TTFT mean {ttft:.1f} ms · TPOT mean {tpot:.1f} ms · ITL mean {itl:.1f} ms · output {output:.1f} tok/s · "
            "total {total:.1f} tok/s over {duration:.2f} s",
            ttft=m["mean_ttft_ms"],
            tpot=m["mean_tpot_ms"],
            itl=m["mean_itl_ms"],
            output=m["output_throughput"],
            total=m["total_token_throughput"],
            duration=m["duration"],
        )
    )
    if figure:
        lines.append(tr("figure: {path}", path=figure))
    return "\n".join(lines)


def _continued(prompt: str, completion: str) -> list[str]:
    """The prompt, then its completion in green where the prompt ends, line by line (line feeds at its end left out),
    escaped for the terminal (a submission's engine chose the completion's tokens: nothing in them acts on the
    terminal)."""
    lines = escape.terminal_lines(prompt)
    more = [click.style(line, fg="green") if line else line for line in escape.terminal_lines(completion.rstrip("\n"))]
    return lines[:-1] + [lines[-1] + more[0], *more[1:]]
