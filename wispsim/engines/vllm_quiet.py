"""vLLM's known-harmless startup messages: hidden, counted, and named in one line.

Starting vLLM's CPU backend the way ``wispsim serve`` does (random weights, no tokenizer, eager
mode, engine core in this process) logs some twenty INFO lines and a dozen warnings that say
nothing is wrong -- among them a logged ``ValueError: Tokenizer not available``, from a chat
template warm-up wispsim never needs (it sends token ids). :func:`hide_known_harmless` drops
exactly the messages listed in :data:`KNOWN` (logger, message start, and for the one with a
traceback, its exception) and vLLM's INFO lines, counts the warnings it hid, and leaves every
other message -- and every error -- as it was. ``docs/serve.md`` lists them ("Known-harmless
vLLM messages"); ``wispsim serve --verbose`` shows everything.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Known:
    """A known-harmless log message: its logger, how its text starts, and (for one logged with
    a traceback) how its exception reads."""

    logger: str
    start: str
    exception: str = ""

    def matches(self, record: logging.LogRecord) -> bool:
        if record.name != self.logger or not record.getMessage().startswith(self.start):
            return False
        if not self.exception:
            return record.exc_info is None
        exc = record.exc_info[1] if record.exc_info else None
        return exc is not None and f"{type(exc).__name__}: {exc}".startswith(self.exception)


KNOWN = (
    # no triton-cpu wheel for this vLLM: vLLM uses its native CPU kernels instead
    Known("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend."),
    Known("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs."),
    Known("vllm.config.vllm", "Model Runner V2 requires Triton; using the V1 model runner instead."),
    Known("vllm.platforms.cpu", "Reset SSM cache type to float32"),  # no Mamba layers here
    # the engine core in this process, seeded: what wispsim asks for
    Known("vllm.engine.arg_utils", "The global random seed is set to "),
    # eager mode (enforce_eager): no compile for every new batch shape, as the profiles were measured
    Known("vllm.config.vllm", "Enforce eager set, disabling torch.compile"),
    Known("vllm.config.vllm", "Inductor compilation was disabled by user settings"),
    # performance hints the shipped CPU profiles were measured without (so estimates match)
    Known("vllm.v1.worker.cpu_worker", "libtcmalloc is not found in LD_PRELOAD."),
    Known("vllm.v1.worker.cpu_worker", "libiomp is not found in LD_PRELOAD."),
    Known("vllm.v1.worker.cpu_worker", "CPU backend doesn't allow to use `torch.set_num_threads`"),
    # at the first request: wispsim hands the engine token-id prompts (vLLM 0.32 still takes them)
    # and stops responses by their length, from a model without a tokenizer
    Known("vllm.v1.engine.input_processor", "Passing raw prompts to InputProcessor is deprecated"),
    Known("vllm.renderers.base", "Using None for EOS token id because tokenizer is not initialized"),
    # a chat-template warm-up that needs a tokenizer; wispsim sends token ids and has none
    Known(
        "vllm.renderers.base",
        "Chat template warmup failed",
        "ValueError: Tokenizer not available when `skip_tokenizer_init=True`",
    ),
)

# Python warnings: (category, the file that raises it, relative to site-packages, message start)
KNOWN_WARNINGS = (
    # vLLM's kernel dispatcher looks at torch.distributed's attributes, one of them deprecated
    (FutureWarning, "vllm/triton_utils/dispatcher.py", "`torch.distributed.reduce_op` is deprecated"),
)


class KnownHarmless(logging.Filter):
    """Drops the records :data:`KNOWN` lists (never an error), counting them in ``hidden``."""

    def __init__(self, known: tuple[Known, ...] = KNOWN) -> None:
        super().__init__()
        self.known = known
        self.hidden = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        if any(k.matches(record) for k in self.known):
            self.hidden += 1
            return False
        return True

    def known_warning(self, category: type[Warning], message: str, filename: str) -> bool:
        """Whether a Python warning is one of :data:`KNOWN_WARNINGS` (counted if so)."""
        path = Path(filename).as_posix()
        for cat, where, start in KNOWN_WARNINGS:
            if issubclass(category, cat) and path.endswith("/" + where) and message.startswith(start):
                self.hidden += 1
                return True
        return False

    def note(self) -> str:
        """The one line that says what was hidden."""
        return (
            f"vLLM: {self.hidden} known-harmless startup warnings and its INFO lines hidden "
            "(docs/serve.md lists them; --verbose shows them)"
        )


def hide_known_harmless() -> KnownHarmless:
    """Install the filter on the loggers :data:`KNOWN` names and on Python's warnings, and turn
    vLLM's INFO lines off (unless ``VLLM_LOGGING_LEVEL`` says otherwise). Call it before vLLM is
    imported; the filter it returns counts what it hid."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    quiet = KnownHarmless()
    for name in dict.fromkeys(k.logger for k in KNOWN):
        logging.getLogger(name).addFilter(quiet)
    shown = warnings.showwarning

    def showwarning(message: Any, category: type[Warning], filename: str, lineno: int, *rest: Any) -> None:
        if not quiet.known_warning(category, str(message), filename):
            shown(message, category, filename, lineno, *rest)

    warnings.showwarning = showwarning
    return quiet
