"""The resident verifier on vLLM's CPU backend, held to a server's promises (issue 42).

A model whose next token depends on its whole context (``tests.support.context_model``: random
weights, saved and loaded as a real checkpoint) makes a corrupted KV cache visible: every round of
every session is checked, token and log-probability, against a fresh request over the same tokens
on a second engine with the same weights and no prefix cache (so it shares no block with
anything, and the first engine's sessions cannot make it wait). Sessions share prompts and
drafts so that vLLM's prefix cache hands one session's blocks to another: the shape in which a
rollback used to overwrite KV another session was reading. The engine is small (39 usable KV
blocks of 128 tokens, 8 request slots) so that running out of room is easy to reach: a round that
cannot be scheduled must end an idle session or fail, never wait forever.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")
pytest.importorskip("transformers")

from tests.support import context_model

pytestmark = pytest.mark.slow  # starts a real vLLM engine

BLOCKS = 40  # vLLM keeps one for itself: 39 usable
SLOTS = 8  # max_num_seqs: paused resident sessions hold one each
VOCAB = 512


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from wispsim.engines.vllm import open_llm

    folder = context_model(tmp_path_factory.mktemp("ctx") / "model")
    return open_llm(
        str(folder), dtype="float32", max_len=1100, max_batch_tokens=4096, max_seqs=SLOTS, kv_blocks=BLOCKS
    )


@pytest.fixture(scope="module")
def ref(llm: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same model on an engine of its own, prefix caching off: the fresh requests' engine."""
    from wispsim.engines.vllm import open_llm

    folder = llm.llm_engine.model_config.model
    return open_llm(
        folder, dtype="float32", max_len=1100, max_batch_tokens=8192, max_seqs=16, prefix_caching=False
    )


@pytest.fixture(scope="module")
def params() -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, logprobs=0)


@pytest.fixture
def sessions(llm: Any, params: Any) -> Any:
    from wispsim.engines.vllm_sessions import ResidentSessions

    res = ResidentSessions(llm, params)
    yield res
    res.clear()


def _answer(o: Any) -> tuple[int, float]:
    out = o.outputs[0]
    token = int(out.token_ids[-1])
    return token, float(out.logprobs[-1][token].logprob)


def fresh(llm: Any, params: Any, seqs: list[list[int]]) -> list[tuple[int, float]]:
    """Next token and its log-probability of each sequence as a new request (on ``ref``'s engine:
    no prefix cache; the salt is for an engine with one)."""
    from vllm.inputs import TokensPrompt

    fresh.n = getattr(fresh, "n", 0) + 1  # type: ignore[attr-defined]
    eng = llm.llm_engine
    ids = [f"fresh-{fresh.n}-{i}" for i in range(len(seqs))]  # type: ignore[attr-defined]
    for rid, seq in zip(ids, seqs, strict=True):
        eng.add_request(rid, TokensPrompt(prompt_token_ids=seq, cache_salt=rid), params)
    got: dict[str, tuple[int, float]] = {}
    while len(got) < len(ids):
        for o in eng.step():
            if o.request_id in ids and o.finished:
                got[o.request_id] = _answer(o)
    return [got[rid] for rid in ids]


class Checker:
    """Runs rounds on resident sessions and checks each against a fresh request."""

    def __init__(self, res: Any, ref: Any, params: Any) -> None:
        self.res, self.llm, self.params = res, ref, params
        self.rounds = 0
        self.worst = 0.0
        self.wrong: list[tuple[int, int]] = []

    def run(self, items: list[tuple[int, list[int], list[int]]]) -> tuple[list[int | None], tuple[int, ...]]:
        from wispsim.engines.vllm_sessions import external_id

        bonus, held = self.res.run(items)
        served = [(sid, c, d) for (sid, c, d), b in zip(items, bonus, strict=True) if b is not None]
        ref = fresh(self.llm, self.params, [c + d for _, c, d in served])
        for (sid, _, _), (token, lp) in zip(served, ref, strict=True):
            got_token, got_lp = _answer(self.res.outputs[external_id(sid)])
            self.rounds += 1
            self.worst = max(self.worst, abs(got_lp - lp))
            if got_token != token or abs(got_lp - lp) > 1e-3:
                self.wrong.append((sid, self.rounds))
        return bonus, held


def _count_copies(llm: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count vLLM's copy-on-write calls (one per rollback into a block another request reads)."""
    mgrs = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.coordinator.single_type_managers
    calls = [0]
    for mgr in mgrs:
        original = mgr._apply_cow

        def counted(*args: Any, _original: Any = original) -> Any:
            calls[0] += 1
            return _original(*args)

        monkeypatch.setattr(mgr, "_apply_cow", counted)
    return calls


def test_the_model_depends_on_its_context(ref: Any, params: Any) -> None:
    """The premise of the equivalence test: a token a few positions back changes the answer."""
    rng = np.random.default_rng(5)
    base = [rng.integers(1, VOCAB, 200).tolist() for _ in range(20)]
    alt = [[*b[:195], int(rng.integers(1, VOCAB)), *b[196:]] for b in base]
    a, b = fresh(ref, params, base), fresh(ref, params, alt)
    assert sum(x[0] != y[0] for x, y in zip(a, b, strict=True)) >= 2
    assert all(abs(x[1] - y[1]) > 1e-4 for x, y in zip(a, b, strict=True) if x[0] == y[0])


def test_rounds_over_shared_blocks_match_fresh_requests(
    sessions: Any, llm: Any, ref: Any, params: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two honest devices with the same prompt and first draft, the second opening one batch
    after the first (it reads the first's cached blocks); and a client that caches the victim's
    prompt first, then rejects its drafts inside the block the victim reads. Every round of every
    session gives a fresh request's token and log-probability; the rollbacks into shared blocks
    wrote into copies."""
    copies = _count_copies(llm, monkeypatch)
    check = Checker(sessions, ref, params)
    rng = np.random.default_rng(0)
    sid = 0
    for trial in range(6):
        plen = 244 + 2 * trial  # prompt + first draft crosses the 256-token block boundary
        prompt = rng.integers(1, VOCAB, plen).tolist()
        first = rng.integers(1, VOCAB, 8).tolist()
        a, b = sid, sid + 1
        sid += 2
        committed = {a: list(prompt), b: list(prompt)}
        for rnd in range(5):
            order = [a] if rnd == 0 else [b, a]  # b opens after a's first round, before its second
            for s in order:
                fresh_draft = rnd == 0 or (s == b and rnd == 1)
                draft = first if fresh_draft else rng.integers(1, VOCAB, 8).tolist()
                bonus, _ = check.run([(s, list(committed[s]), draft)])
                accepted = int(rng.integers(0, 4))  # few accepted: the cut falls inside the shared block
                committed[s] += [*draft[:accepted], bonus[0]]
        sessions.end([a, b])
    for _ in range(4):  # the attacker caches the victim's prompt first
        victim_prompt = rng.integers(1, VOCAB, 262).tolist()
        bad, victim = sid, sid + 1
        sid += 2
        committed = {bad: victim_prompt[:250], victim: list(victim_prompt)}
        check.run([(bad, list(committed[bad]), victim_prompt[250:258])])  # blocks 0-1 = the victim's
        committed[bad] += [*victim_prompt[250:251], 7]
        for _ in range(4):
            for s in (victim, bad):
                draft = rng.integers(1, VOCAB, 8).tolist()
                bonus, _ = check.run([(s, list(committed[s]), draft)])
                accepted = 0 if s == bad else int(rng.integers(0, 9))
                committed[s] += [*draft[:accepted], bonus[0]]
        sessions.end([bad, victim])
    assert check.wrong == [] and check.worst < 1e-3, (check.wrong, check.worst)
    assert check.rounds >= 80 and copies[0] >= 5  # the shared-block path really ran


def test_resident_rounds_batched_together_match_fresh_requests(
    sessions: Any, llm: Any, ref: Any, params: Any
) -> None:
    """Sessions of one batch, sharing a prompt: rolled back, resumed and verified together."""
    check = Checker(sessions, ref, params)
    rng = np.random.default_rng(3)
    prompt = rng.integers(1, VOCAB, 250).tolist()
    committed = {s: list(prompt) for s in range(4)}
    for rnd in range(6):
        items = [(s, list(committed[s]), rng.integers(1, VOCAB, 6).tolist()) for s in committed]
        bonus, held = check.run(items)
        if rnd > 0:
            assert all(h >= len(c) - 1 for (_, c, _), h in zip(items, held, strict=True))
        for (s, _, d), b in zip(items, bonus, strict=True):
            accepted = int(rng.integers(0, 7))
            committed[s] += [*d[:accepted], b]
    assert check.wrong == [] and check.rounds == 24


def test_with_no_block_for_the_copy_the_shared_block_is_recomputed(
    sessions: Any, llm: Any, ref: Any, params: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copy on write needs a free block; without one the session gives the shared block up and
    sends its tokens again: the engine holds the tokens up to the block boundary."""
    import wispsim.engines.vllm_sessions as mod

    monkeypatch.setattr(mod, "_can_copy", lambda pool, singles: False)
    check = Checker(sessions, ref, params)
    rng = np.random.default_rng(9)
    prompt = rng.integers(1, VOCAB, 250).tolist()
    draft = rng.integers(1, VOCAB, 8).tolist()
    a_bonus, _ = check.run([(0, list(prompt), draft)])
    check.run([(1, list(prompt), draft)])  # reads a's two full blocks
    committed = [*prompt, draft[0], a_bonus[0]]  # a accepted 1: the cut is inside the shared block
    _, held = check.run([(0, committed, rng.integers(1, VOCAB, 8).tolist())])
    assert held == (256 - 128,)  # given up: back to the last whole block it kept
    assert check.wrong == []


def test_a_round_with_no_room_ends_the_least_recently_used_idle_session(
    sessions: Any, llm: Any, ref: Any, params: Any
) -> None:
    """Ten sessions of 4 blocks each do not fit 39 blocks beside each other (nor 8 slots): each
    new one ends the least recently used idle session, which re-opens cold on its next round."""
    check = Checker(sessions, ref, params)
    rng = np.random.default_rng(4)
    committed = {s: rng.integers(1, VOCAB, 480).tolist() for s in range(10)}
    for s in committed:
        bonus, held = check.run([(s, list(committed[s]), rng.integers(1, VOCAB, 4).tolist())])
        assert bonus[0] is not None and held == (0,)
    assert sessions.evictions >= 2 and 0 not in sessions.sessions  # the first was the oldest
    bonus, held = check.run([(0, committed[0], rng.integers(1, VOCAB, 4).tolist())])
    assert bonus[0] is not None and held == (0,)  # re-opened: nothing of it was held
    assert check.wrong == [] and sessions.stalls == 0


def test_a_batch_that_cannot_fit_fails_its_rounds_instead_of_waiting(
    sessions: Any, llm: Any, ref: Any, params: Any
) -> None:
    """Five rounds of 8 blocks each in one batch cannot all fit 39 blocks, and no idle session
    is left to end: the engine serves what fits and the rest come back None (their sessions
    ended) at once; the engine is usable afterwards."""
    import time

    check = Checker(sessions, ref, params)
    rng = np.random.default_rng(8)
    items = [(s, rng.integers(1, VOCAB, 1000).tolist(), rng.integers(1, VOCAB, 4).tolist()) for s in range(5)]
    t0 = time.monotonic()
    bonus, _ = check.run(items)
    assert time.monotonic() - t0 < 120
    lost = [sid for (sid, _, _), b in zip(items, bonus, strict=True) if b is None]
    assert lost and len(lost) < 5 and sessions.stalls == len(lost)
    assert all(sid not in sessions.sessions for sid in lost)
    sessions.end([sid for sid, _, _ in items])
    again, held = check.run([(lost[0], items[lost[0]][1], [5, 6])])
    assert again[0] is not None and held == (0,) and check.wrong == []


def test_stop_ends_a_batch_between_steps(llm: Any, params: Any) -> None:
    """A server shutting down sets ``stop``: the batch ends at the next step."""
    from wispsim.engines.vllm_sessions import ResidentSessions
    from wispsim.engines.vllm_steps import EngineStopped

    stop = threading.Event()
    res = ResidentSessions(llm, params, stop)
    stop.set()
    with pytest.raises(EngineStopped):
        res.run([(0, list(range(1, 300)), [1, 2])])
    res.clear()


def test_the_engine_reports_the_kv_requests_can_get(llm: Any) -> None:
    """vLLM keeps one block for itself: the capacity admission is sized to leaves it out."""
    from wispsim.engines.vllm import VLLMEngine

    eng = VLLMEngine(llm)
    assert eng.kv_capacity_tokens == (BLOCKS - 1) * 128
    assert eng.max_num_seqs == SLOTS
    assert eng.kv_usage() == 0.0


def test_rejected_context(tmp_path: Path) -> None:
    """``context_model`` writes a checkpoint once and reuses it."""
    folder = context_model(tmp_path / "m")
    stamp = (folder / "config.json").stat().st_mtime
    assert context_model(folder) == folder and (folder / "config.json").stat().st_mtime == stamp
