"""A tokenizer from a local folder (transformers, imported lazily): what a benchmark's datasets
count prompt and completion tokens with. Nothing reaches the hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wispsim.errors import ConfigError


def load_tokenizer(where: str | None) -> Any:
    if where is None or not Path(where).is_dir():
        raise ConfigError(
            "--tokenizer",
            "tokenizer",
            f"got {where!r}; allowed: a local folder holding a tokenizer (the hub is not reached)",
        )
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError(
            "--tokenizer", "tokenizer", "needs transformers: pip install 'wispsim[hf]'"
        ) from None
    try:
        return AutoTokenizer.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(where, "tokenizer", f"cannot be loaded ({str(e).splitlines()[0]})") from None
