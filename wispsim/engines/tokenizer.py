"""A tokenizer from a local folder (transformers, imported lazily): what a benchmark's datasets
count prompt and completion tokens with. Nothing reaches the hub.

transformers imports torch, which imports Triton where vLLM installed it; at interpreter exit
Triton's native module reports some thirty lines of ``nanobind: leaked ... instances`` on stderr,
after everything wispsim printed. :func:`quiet_native_leaks` closes stderr once the command has
finished (an exit handler run before the interpreter's own shutdown), so a one-line error stays
one line."""

from __future__ import annotations

import atexit
import functools
import os
import sys
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
    quiet_native_leaks()
    try:
        return AutoTokenizer.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(where, "tokenizer", f"cannot be loaded ({str(e).splitlines()[0]})") from None


def _close_stderr() -> None:
    if "triton" not in sys.modules:
        return
    sys.stderr.flush()
    with open(os.devnull, "w") as null:  # the interpreter's shutdown writes to a closed-off stream
        os.dup2(null.fileno(), 2)


@functools.cache  # registered once, after whatever exit handlers came before it
def quiet_native_leaks() -> None:
    """At exit, once wispsim has printed everything, send stderr to /dev/null where Triton is
    loaded (module text)."""
    atexit.register(_close_stderr)
