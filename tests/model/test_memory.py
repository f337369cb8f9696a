"""Paged KV memory with prefix cache and LRU eviction (SPEC 2.3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wispsim.model.memory import KVMemory
from wispsim.sim.scenarios import resolve_server
from wispsim.sim.simulation import simulate


def test_blocks_round_up() -> None:
    m = KVMemory(total_blocks=10, block_size=16, prefix_cache=True)
    assert [m.blocks(t) for t in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_round_keeps_committed_prefix_cached() -> None:
    m = KVMemory(total_blocks=10, block_size=16, prefix_cache=True)
    # first round, cold: prompt 20 + k 3 = 23 tokens -> 2 blocks
    assert m.allocate([(7, 23)]) == 0
    assert m.used == 2
    # 2 tokens committed: prefix 22 stays cached, 2 blocks
    m.finish_round(7, 22)
    assert m.cached_tokens(7) == 22
    assert m.used == 2
    m.drop(7)
    assert m.cached_tokens(7) == 0
    assert m.used == 0


def test_without_prefix_cache_nothing_stays() -> None:
    m = KVMemory(total_blocks=10, block_size=16, prefix_cache=False)
    m.allocate([(1, 40), (2, 10)])
    assert m.used == 3 + 1
    m.finish_round(1, 38)
    m.finish_round(2, 9)
    assert m.used == 0
    assert m.cached_tokens(1) == 0


def test_cold_round_after_eviction() -> None:
    # 3 blocks of 16. Session A's prefix of 23 tokens holds 2 blocks. Session B's first round
    # (22 tokens, 2 blocks) needs 2 + 2 = 4 > 3 blocks, so idle A is evicted.
    a, b = 1, 2
    m = KVMemory(total_blocks=3, block_size=16, prefix_cache=True)
    m.allocate([(a, 22)])
    m.finish_round(a, 23)
    assert m.cached_tokens(a) == 23
    assert m.allocate([(b, 22)]) == 1
    assert m.cached_tokens(a) == 0  # A's next round is cold
    assert m.evictions == 1
    assert m.used == 2


def test_eviction_is_least_recently_used_first() -> None:
    # four 1-block sessions fill 4 blocks; touching 1 makes 2 the least recently used
    m = KVMemory(total_blocks=4, block_size=16, prefix_cache=True)
    for s in (1, 2, 3):
        m.allocate([(s, 10)])
        m.finish_round(s, 11)
    m.allocate([(1, 12)])
    m.finish_round(1, 13)
    assert list(m.cache) == [2, 3, 1]
    # session 4 needs 2 blocks; 3 used + 2 > 4: evict exactly one, the LRU (2)
    assert m.allocate([(4, 20)]) == 1
    assert list(m.cache) == [3, 1, 4]
    assert m.used == 4


def test_batch_members_keep_their_own_prefix() -> None:
    # 3 blocks: 1 holds 2 blocks (prefix 20). A batch of {1 growing to 30 tokens, 2 with 10}
    # needs 2 + 1 = 3 blocks; 1's own prefix must not be evicted to make room.
    m = KVMemory(total_blocks=3, block_size=16, prefix_cache=True)
    m.allocate([(1, 18)])
    m.finish_round(1, 20)
    assert m.allocate([(1, 30), (2, 10)]) == 0
    assert m.cached_tokens(1) == 30
    assert m.used == 3


def test_batch_that_cannot_fit_raises() -> None:
    m = KVMemory(total_blocks=2, block_size=16, prefix_cache=True)
    with pytest.raises(RuntimeError, match="does not fit"):
        m.allocate([(1, 20), (2, 20)])


def test_committed_bonus_token_never_overfills_memory() -> None:
    # Regression: the batch held 32 tokens (2 blocks = all memory); all k drafted tokens were
    # accepted so the committed prefix is 33 tokens (the bonus token): 3 blocks. Keeping it
    # must not push `used` over the 2 blocks that exist.
    m = KVMemory(total_blocks=2, block_size=16, prefix_cache=True)
    m.allocate([(1, 32)])
    m.finish_round(1, 33)
    assert m.used <= m.total_blocks


def test_committed_prefix_evicts_idle_lru_to_fit() -> None:
    # 4 blocks: idle session 9 holds 1 block; session 1's batch held 3 blocks (48 tokens) and
    # commits 49 tokens (4 blocks): the idle prefix makes room, session 1 stays cached.
    m = KVMemory(total_blocks=4, block_size=16, prefix_cache=True)
    m.allocate([(9, 10)])
    m.finish_round(9, 10)
    m.allocate([(1, 48)])
    assert m.used == 4
    m.finish_round(1, 49)
    assert m.used == 4
    assert m.cached_tokens(1) == 49
    assert m.cached_tokens(9) == 0
    assert m.evictions == 1


ops = st.lists(
    st.tuples(
        st.sampled_from(["batch", "finish", "drop"]),
        st.lists(st.tuples(st.integers(0, 5), st.integers(1, 70)), min_size=1, max_size=4),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(total=st.integers(5, 12), cache=st.booleans(), script=ops)
def test_memory_accounting_invariants(total: int, cache: bool, script: list) -> None:
    """``used`` always equals the blocks held by cached entries and never exceeds capacity."""
    m = KVMemory(total_blocks=total, block_size=16, prefix_cache=cache)
    for op, items in script:
        sessions = dict(items)  # one entry per session, as in a real batch
        if op == "batch":
            need = sum(m.blocks(t) for t in sessions.values())
            if need > total:
                with pytest.raises(RuntimeError):
                    m.allocate(sessions.items())
                continue
            m.allocate(sessions.items())
            for s, t in sessions.items():
                assert m.cached_tokens(s) == t  # batch members are resident
        elif op == "finish":
            for s, t in sessions.items():
                m.finish_round(s, t + 1)
        else:
            for s in sessions:
                m.drop(s)
        assert m.used == sum(b for _, b in m.cache.values())
        assert all(b == m.blocks(t) for t, b in m.cache.values())
        assert 0 <= m.used <= total


def test_block_eviction_frees_only_the_tail_blocks_it_needs() -> None:
    # 10 blocks of 16 tokens: sessions 1 (64 tokens = 4 blocks) and 2 (48 = 3 blocks) idle, LRU 1.
    m = KVMemory(10, 16, True, eviction="block")
    m.finish_round(1, 64)
    m.finish_round(2, 48)
    assert m.used == 7
    # a cold batch of 80 tokens (5 blocks) needs 2 more blocks than are free: only 2 of session
    # 1's 4 blocks go, from its tail, so it keeps a 32-token prefix hit
    assert m.allocate([(3, 80)]) == 1
    assert m.cached_tokens(1) == 32 and m.cache[1][1] == 2
    assert m.cached_tokens(2) == 48
    assert m.used == 10
    # the same under session eviction drops session 1 whole
    s = KVMemory(10, 16, True, eviction="session")
    s.finish_round(1, 64)
    s.finish_round(2, 48)
    s.allocate([(3, 80)])
    assert s.cached_tokens(1) == 0 and s.cached_tokens(2) == 48 and s.used == 8


def test_block_eviction_gives_partial_hits_in_the_simulation(tmp_path) -> None:
    from wispsim.sim.scenarios import load_scenario
    from wispsim.sim.simulation import simulate

    over = {
        "policy": "wisp-lru",
        # token-granular reuse (the eviction, not the reuse, is what this checks)
        "server": {
            "gpu_memory_utilization": 0.87,  # ~5.6 GiB of KV: eviction binds, responses still finish
            "eviction": "block",
            "profile": "a100-qwen3-32b-paper",
            "prefix_reuse": "token",
        },
        "workload": {"warmup_s": 2, "duration_s": 6},
        "acceptance": {"model": "latent"},
        "drafting": {"predictor": {"name": "confidence"}},
    }
    res = simulate(resolve_server(load_scenario(overrides=over).with_devices(80, (8.0,))), seed=0)
    r = res.rounds
    partial = r[(r.l_cached > 0) & (r.l_new > r.k)]
    assert len(partial) > 0  # some rounds found only the head of their prefix cached
    # however much was cached, L_total is the whole prefix (prompt + committed) plus the drafts
    prompt = r.response.map(res.responses.set_index("response").prompt_len)
    known = prompt.notna()
    assert known.sum() > 0
    assert ((r.l_new + r.l_cached)[known] == (prompt + r.position + r.k)[known]).all()
    assert (partial.l_cached % 16 == 0).all()  # partial hits are whole blocks


def test_block_granular_reuse_forwards_the_tail_after_the_last_whole_block(det_scenario) -> None:
    """vLLM's prefix cache hashes whole blocks: a warm round reads floor(prefix / B) * B tokens
    from the cache and forwards the rest of its prefix with its drafts (server.engine.prefix_reuse)."""
    sections = {
        "workload": {"prompt_tokens": {"dist": "constant", "value": 40, "min": 40, "max": 40}},
        "server": {"block_size": 16},
    }
    token = simulate(resolve_server(det_scenario(**sections))).rounds
    sections["server"] = {"block_size": 16, "prefix_reuse": "block"}
    block = simulate(resolve_server(det_scenario(**sections))).rounds
    warm_t, warm_b = token[token.l_cached > 0], block[~block.cold]
    assert len(warm_t) and len(warm_b)
    assert (warm_t.l_new == warm_t.k).all()  # token reuse: only the drafts are new
    assert (warm_b.l_cached % 16 == 0).all() and (warm_b.l_new > warm_b.k).any()
    # what is cached plus what is forwarded is the whole context (prompt + committed + drafts)
    for r in (token, block):
        assert (r.l_new + r.l_cached == 40 + r.position + r.k).all()
    assert (warm_b.l_cached == (40 + warm_b.position) // 16 * 16).all()


def test_block_size_comes_from_the_profiles_engine_unless_the_scenario_sets_one(tmp_path) -> None:
    """``server.engine.block_size: null`` (the default) takes the profile's ``kv_block_size`` (vLLM's CPU
    backend: 128), or 16 where the profile does not say; a number in the scenario wins."""
    import yaml

    from tests.support import profile_dict
    from wispsim.model.memory import block_size
    from wispsim.model.profiles import load_profile
    from wispsim.sim.scenarios import load_scenario

    path = tmp_path / "cpu-vllm.yaml"
    path.write_text(yaml.safe_dump({**profile_dict(capacity_tokens=128 * 1000), "kv_block_size": 128}))
    prof = load_profile(str(path))
    assert prof.kv_block_size == 128
    assert block_size(None, prof) == 128 and block_size(16, prof) == 16
    assert block_size(None, load_profile("a100-qwen3-32b-paper")) == 16
    server = {"profile": str(path), "gpu_memory_utilization": 1.0, "activation_reserve_gib": 0.0}
    over = {"server": server, "workload": {"warmup_s": 0, "duration_s": 2}}
    res = simulate(resolve_server(load_scenario(overrides=over).with_devices(4, (4.0,))), seed=0)
    assert res.kv_blocks == 1000 and res.block_size == 128
    over["server"] = {**server, "block_size": 16}
    assert (
        simulate(resolve_server(load_scenario(overrides=over).with_devices(4, (4.0,))), seed=0).kv_blocks
        == 8000
    )


@settings(max_examples=150, deadline=None)
@given(
    total=st.integers(4, 40),
    eviction=st.sampled_from(["session", "block"]),
    held=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 120)), max_size=12),
    finished=st.lists(st.tuples(st.integers(0, 12), st.integers(1, 200)), min_size=1, max_size=8),
)
def test_finish_batch_is_finish_round_for_each_member(
    total: int, eviction: str, held: list[tuple[int, int]], finished: list[tuple[int, int]]
) -> None:
    """One finish_batch call over a batch leaves the cache, its LRU order, the blocks used and the
    eviction count exactly as finishing its members one at a time, in order, does."""

    class Member:
        def __init__(self, session: int, prefix_after: int) -> None:
            self.session, self.prefix_after = session, prefix_after

    def filled() -> KVMemory:
        m = KVMemory(total_blocks=total, block_size=16, prefix_cache=True, eviction=eviction)
        for s, tokens in held:
            if m.blocks(tokens) <= total:
                m.finish_round(s, tokens)  # idle cached prefixes, evicted LRU-first as they come
        return m

    batch = [Member(s, p) for s, p in finished]
    one, each = filled(), filled()
    evicted = one.finish_batch(batch)
    assert evicted == sum(each.finish_round(r.session, r.prefix_after) for r in batch)
    assert list(one.cache.items()) == list(each.cache.items())
    assert (one.used, one.evictions) == (each.used, each.evictions)
