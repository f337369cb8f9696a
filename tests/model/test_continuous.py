"""Continuous batching as a pure scheduler, and request-level static batching beside it
(``server.engine.batching``; issue 46's search for the paper's centralized baseline)."""

from __future__ import annotations

from wispsim.model.continuous import ContinuousBatcher, Sequence
from wispsim.model.memory import KVMemory


def _run(
    static: bool, outputs: list[int], late: int = 0
) -> tuple[list[tuple[int, int, list[int]]], KVMemory]:
    """Steps of a batcher fed one sequence per output length (and ``late`` more after the first
    step): per step, (running, decodes, ids finished)."""
    mem = KVMemory(1000, 16, prefix_cache=False)
    b = ContinuousBatcher(mem, max_running=8, step_tokens=4096, static=static)
    seqs = [Sequence(i, 8, o, 0, None) for i, o in enumerate(outputs)]
    for s in seqs:
        b.add(s)
    log = []
    now = 0.0
    for i in range(40):
        if i == 1:
            for j in range(late):
                b.add(Sequence(100 + j, 8, 2, 0, None))
        b.begin()
        if not b.running and not b.waiting:
            break
        step = b.schedule(idle=False, now=now)
        if step is None:
            break
        now += 1.0
        done = b.commit(step, now)
        log.append((len(b.running), step.decoding, [s.item for s in done]))
    return log, mem


def test_continuous_batching_lets_a_request_join_at_the_next_step_and_frees_a_finished_one() -> None:
    log, mem = _run(False, [1, 5], late=1)
    # step 1: both prompts prefill (first tokens); the 1-token response ends there and leaves
    assert log[0][2] == [0]
    # the late arrival (2 tokens) joins at once: step 2 prefills it (its first token) beside the
    # running response's decode, and step 3 gives its last token
    assert log[1][1] == 2 and log[2][2] == [100]
    assert mem.free == 1000  # every block given back


def test_static_batching_admits_a_batch_only_when_the_last_one_ends_and_pads_finished_rows() -> None:
    log, mem = _run(True, [1, 5], late=1)
    finished = [d for _, _, d in log]
    assert finished[0] == [0]  # the short response ends with its first token ...
    # ... but stays in the batch as padding: every step of the batch decodes both rows
    batch = [entry for entry in log[1:] if 1 in entry[2] or not entry[2]][:3]
    assert all(decoding == 2 for _, decoding, _ in batch)
    end = next(i for i, (_, _, d) in enumerate(log) if 1 in d)
    assert all(100 not in d for _, _, d in log[: end + 1])  # the late one waited for the batch
    assert any(100 in d for _, _, d in log[end + 1 :])
    assert mem.free == 1000


def test_static_batching_costs_more_steps_than_continuous_for_the_same_work() -> None:
    cont, _ = _run(False, [1, 9], late=3)
    stat, _ = _run(True, [1, 9], late=3)
    assert len(stat) > len(cont)
    assert sum(d for _, d, _ in stat) > sum(d for _, d, _ in cont)  # padded decodes are work


def test_static_batching_preempts_a_generating_row_never_a_padding_one() -> None:
    """Short of memory, static batching preempts the newest row still generating: a finished
    (padding) row holds only its finished KV and leaves with its batch, never to be prefilled again."""
    mem = KVMemory(3, 16, prefix_cache=False)  # 48 tokens: both fit at first, not as A grows
    b = ContinuousBatcher(mem, max_running=8, step_tokens=4096, static=True)
    a, short = Sequence("A", 20, 20, 0, None), Sequence("B", 10, 1, 0, None)
    b.add(a)
    b.add(short)
    prefills_of_b = 0
    for i in range(60):
        b.begin()
        if not b.running and not b.waiting:
            break
        step = b.schedule(idle=False, now=float(i))
        prefills_of_b += sum(1 for s, new in step.work if s is short and new > 1)
        b.commit(step, float(i + 1))
    assert a.generated == 20 and short.generated == 1
    assert prefills_of_b == 1  # B was prefilled once, in the first step


def test_a_step_computes_one_logit_row_per_request_a_prompts_tokens_none() -> None:
    """vLLM's ``logits_indices``: a generation step's LM head runs once per scheduled request (a
    decode's token, a prefill chunk's last), not over the prompt tokens a chunk forwards."""
    mem = KVMemory(1000, 16, prefix_cache=False)
    b = ContinuousBatcher(mem, max_running=8, step_tokens=4096)
    for i in range(3):
        b.add(Sequence(i, 100 * (i + 1), 4, 0, None))
    b.begin()
    step = b.schedule(idle=True, now=0.0)
    assert step is not None
    assert step.shape.n_linear == 600 and step.shape.n_logits == 3  # three prompts, three rows
    b.commit(step, 1.0)
    b.begin()
    step = b.schedule(idle=False, now=1.0)
    assert step is not None
    assert step.shape.n_linear == step.shape.n_logits == 3  # three decodes
