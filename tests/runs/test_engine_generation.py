"""The engine generation's settings (``server.engine.use_v1``, ``enable_chunked_prefill``,
``num_scheduler_steps``, ``multi_step_stream_outputs``) honoured on every path: a run, a replay
and a benchmark each simulate something else with each one set than without it; a real server
(``wispsim serve``, vLLM V1) refuses the V0 ones by name."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.runs.test_run import ScenarioFile
from wispsim.runs.resolve import Options
from wispsim.runs.run import replay, run

# each field as a planner sets it, against what it is compared with. Two devices send a 16-token
# prompt (and 7 tokens of output) each at t = 0 into steps of 24 tokens: chunked, the second
# prompt starts beside the first; whole, it waits a step; on V0 its step is a prefill-only one;
# multi-step runs the decodes in runs of 4; streaming at a run's end delays each response's end.
BUDGET = ["server.engine.max_num_batched_tokens=24"]
STEPS = ["server.engine.num_scheduler_steps=4"]
CASES = {
    "enable_chunked_prefill": ([], ["server.engine.enable_chunked_prefill=false"]),
    "use_v1": (["server.engine.enable_chunked_prefill=false"], ["server.engine.use_v1=false"]),
    "num_scheduler_steps": (["server.engine.use_v1=false"], STEPS),
    "multi_step_stream_outputs": (STEPS, [*STEPS, "server.engine.multi_step_stream_outputs=false"]),
}


def _times(folder: Path) -> pd.DataFrame:
    """The steps and the responses a run or replay wrote, as the comparison sees them."""
    steps = pd.read_parquet(folder / "batches.parquet")[["t_dispatch", "t_end", "size"]]
    ends = pd.read_parquet(folder / "responses.parquet")[["t_end"]]
    return pd.concat([steps.reset_index(drop=True), ends.reset_index(drop=True)], axis=1)


@pytest.mark.parametrize("field", list(CASES))
def test_a_run_and_a_replay_honour_each_setting(
    field: str, scenario_file: ScenarioFile, tmp_path: Path
) -> None:
    base, setting = CASES[field]
    centralized = scenario_file(policy="centralized", workload={"duration_s": 2.0})
    outs = {}
    for name, sets in (("base", base), ("set", setting)):
        out = tmp_path / f"run-{name}"
        run(centralized, [*BUDGET, *sets], Options(), out=out)
        outs[f"run-{name}"] = _times(out)
    assert not outs["run-base"].equals(outs["run-set"]), f"a run ignored {field}"
    # a replay of a recorded (speculative) deployment's devices under centralized serving
    log = tmp_path / "log.parquet"
    run(scenario_file(workload={"duration_s": 2.0}), None, Options(), out=tmp_path / "recorded", log=log)
    for name, sets in (("base", base), ("set", setting)):
        out = tmp_path / f"replay-{name}"
        replay(log, None, [*BUDGET, *sets], "centralized", None, out=out)
        outs[f"replay-{name}"] = _times(out)
    assert not outs["replay-base"].equals(outs["replay-set"]), f"a replay ignored {field}"


@pytest.mark.parametrize("field", list(CASES))
def test_a_benchmark_honours_each_setting_set_as_a_run_sets_it(field: str) -> None:
    from wispsim.runs.bench import Client, Server, run_bench
    from wispsim.runs.bench_profile import profile_of

    base, setting = CASES[field]
    prof = profile_of("qwen3-14b", "h100-80gb", 1, "auto", None)
    client = Client(num_prompts=40, max_concurrency=8, random_input_len=300, random_output_len=30,
                    random_range_ratio=0.5)  # fmt: skip
    server = Server(max_num_batched_tokens=1024, async_scheduling=False)
    a, _ = run_bench(prof, client, server, base or None)
    b, _ = run_bench(prof, client, server, setting)
    figures = ("mean_ttft_ms", "mean_itl_ms", "p99_itl_ms", "duration")
    assert [a[k] for k in figures] != [b[k] for k in figures], f"a benchmark ignored {field}"
    assert a["server"] != b["server"]  # and the result says how each ran


def test_a_real_server_refuses_v0s_settings_by_name() -> None:
    pytest.importorskip("fastapi", reason="the serve extra: pip install 'wispsim[serve]'")
    from tests.serve.test_serve import SCENARIO
    from wispsim.errors import ConfigError
    from wispsim.runs.serve import served_scenario

    for sets, name in (
        (["server.engine.use_v1=false"], "use_v1"),
        (["server.engine.num_scheduler_steps=4"], "use_v1"),
        (["server.engine.enable_chunked_prefill=false"], "enable_chunked_prefill"),
    ):
        with pytest.raises(ConfigError, match=rf"server\.engine\.{name}"):
            served_scenario(SCENARIO, ["server.engine.max_num_batched_tokens=8192", *sets],
                            Options(policy="centralized"))  # fmt: skip
    # a run's end is where multi-step streams or not: without multi-step (all V1 has) nothing
    # differs on any path, so a real server takes it as vLLM does
    served_scenario(
        SCENARIO, ["server.engine.multi_step_stream_outputs=false"], Options(policy="centralized")
    )
