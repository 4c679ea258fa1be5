"""Text at the engine's edge: a model folder's tokenizer turns prompts into token ids and completions back into text.

The engine itself (`engine.run`, `Engine.generate`, and the sandboxed engine of `--submission`) only ever sees token
ids; encoding and decoding happen here, on the trusted side. A folder's `tokenizer.json` is Hugging Face's format,
read with their `tokenizers` library (Qwen3's byte-level BPE, or the shipped `qwen3-course`'s); presets have random
weights and no tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from engine.model import ModelError, folder_of
from engine.words import tr

TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Text:
    """One model's tokenizer and its end-of-sequence token."""

    tokenizer: Tokenizer
    eos_token_id: int | None
    """The config's `eos_token_id`, else the token `tokenizer_config.json` names as `eos_token`, else None."""

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`, with the special tokens the tokenizer's own template adds (as `tokenizer(text)`
        in transformers): none for Qwen3's, the EOS first as a BOS for qwen3-course's."""
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens (EOS among them) left out."""
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def completion(self, prompt: list[int], output: list[int]) -> str:
        """The text `output` adds after `prompt`: decoded together, so that a decoder that joins words (spaces between
        them, not in them) puts the space where it belongs; decoded alone where the prompt's text is not a prefix."""
        before, together = self.decode(prompt), self.decode(prompt + output)
        return together[len(before) :] if together.startswith(before) else self.decode(output)


def has_tokenizer(name_or_folder: str | Path) -> bool:
    """Whether the model (a shipped name, a preset or a folder) comes with a tokenizer.json."""
    folder = folder_of(name_or_folder)
    return folder is not None and (folder / TOKENIZER_FILE).is_file()


def load_text(name_or_folder: str | Path, *, config_eos: int | None = None) -> Text:
    """The tokenizer of a model folder (or of a shipped model by name).

    Raises:
        ModelError: a preset (random weights, no tokenizer), a folder without tokenizer.json, or a file the
            `tokenizers` library cannot read.
    """
    folder = folder_of(name_or_folder)
    if folder is None:
        raise ModelError(
            tr(
                "the preset {name} has random weights and no {file}: text prompts need a model folder with one (the default, "
                "qwen3-course, has it); give token ids with --prompts FILE instead",
                name=repr(str(name_or_folder)),
                file=TOKENIZER_FILE,
            )
        )
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise ModelError(
            tr(
                "{folder} has no {file}, so text prompts cannot be encoded; give token ids with --prompts FILE instead",
                folder=folder,
                file=TOKENIZER_FILE,
            )
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 (the library raises plain Exceptions for files it cannot parse)
        raise ModelError(tr("{path} is not a tokenizer the `tokenizers` library reads: {error}", path=path, error=e)) from None
    return Text(tokenizer, config_eos if config_eos is not None else _named_eos(folder, tokenizer))


def _named_eos(folder: Path, tokenizer: Tokenizer) -> int | None:
    """The EOS that tokenizer_config.json names (Hugging Face's folders have one), else `<|endoftext|>` if the
    vocabulary has it."""
    name: object = "<|endoftext|>"
    config = folder / "tokenizer_config.json"
    if config.is_file():
        try:
            token = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
        except (OSError, ValueError, AttributeError):
            token = None
        name = token.get("content") if isinstance(token, dict) else token or name
    return tokenizer.token_to_id(name) if isinstance(name, str) else None
