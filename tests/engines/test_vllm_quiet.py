"""The filter of vLLM's known-harmless startup messages: it hides exactly those it lists and keeps
every other message and every error (no engine needed: records are made by hand)."""

from __future__ import annotations

import logging
import sys

import pytest

from tests.support import ROOT
from wispsim.engines.vllm_quiet import KNOWN, KnownHarmless


def record(
    logger: str, msg: str, *args: object, level: int = logging.WARNING, exc: BaseException | None = None
) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(logger, level, "x.py", 1, msg, args, exc_info)


def tokenizer_error() -> BaseException:
    try:
        raise ValueError("Tokenizer not available when `skip_tokenizer_init=True`")
    except ValueError as e:
        return e


# as vLLM 0.32's CPU backend logs them when wispsim serve starts it
SEEN = [
    record(
        "vllm.triton_utils.importing",
        "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    ),
    record(
        "vllm.engine.arg_utils",
        "The global random seed is set to %d. Since VLLM_ENABLE_V1_MULTIPROCESSING is set to False, this may "
        "affect the random state of the Python process that launched vLLM.",
        0,
    ),
    record(
        "vllm.config.vllm", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup."
    ),
    record("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs."),
    record(
        "vllm.v1.worker.cpu_worker", "%s is not found in LD_PRELOAD. For best performance, ...", "libiomp"
    ),
    record(
        "vllm.v1.worker.cpu_worker",
        "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding, skip it.",
    ),
    record("vllm.renderers.base", "Chat template warmup failed", exc=tokenizer_error()),
]


def test_the_known_messages_are_hidden_and_counted() -> None:
    quiet = KnownHarmless()
    assert [quiet.filter(r) for r in SEEN] == [False] * len(SEEN)
    assert quiet.hidden == len(SEEN)
    assert quiet.note().startswith(f"vLLM: {len(SEEN)} known-harmless startup warnings")
    assert "\n" not in quiet.note()


@pytest.mark.parametrize(
    "rec",
    [
        # an unknown warning of a logger the filter watches
        record("vllm.v1.worker.cpu_worker", "KV cache is too small for the model"),
        # a known text from another logger
        record("vllm.core", "Triton is not installed. triton-cpu is expected on x86 CPUs."),
        # a known text as an error
        record(
            "vllm.platforms.cpu",
            "Triton is not installed. triton-cpu is expected on x86 CPUs.",
            level=logging.ERROR,
        ),
        # the chat-template warm-up failing for another reason
        record("vllm.renderers.base", "Chat template warmup failed", exc=RuntimeError("out of memory")),
        record("vllm.renderers.base", "Chat template warmup failed"),
        record("vllm.engine.arg_utils", "The model's max seq len is larger than the KV cache"),
    ],
)
def test_every_other_message_is_kept(rec: logging.LogRecord) -> None:
    quiet = KnownHarmless()
    assert quiet.filter(rec) is True
    assert quiet.hidden == 0


def test_python_warnings_match_on_category_file_and_text() -> None:
    quiet = KnownHarmless()
    here = f"{sys.prefix}/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py"
    text = "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead"
    assert quiet.known_warning(FutureWarning, text, here)
    assert not quiet.known_warning(FutureWarning, "something else is deprecated", here)
    assert not quiet.known_warning(UserWarning, text, here)
    assert not quiet.known_warning(FutureWarning, text, "/src/mine/dispatcher.py")
    assert quiet.hidden == 1


def test_the_list_is_what_docs_serve_md_names() -> None:

    doc = (ROOT / "docs/serve.md").read_text()
    section = " ".join(doc.split("## Known-harmless vLLM messages", 1)[1].split())
    for k in KNOWN:
        assert k.start.split("`")[0][:30] in section, k.start
