"""Write the offline prompt sets used to record acceptance traces.

Two prompt families, both built from what ships with CPython (no download):

- ``code``: "complete this function" prompts from the signatures and docstrings of pure-Python
  functions in the standard library;
- ``nl``: natural-language instructions written from the first paragraph of standard-library
  module documentation ("Explain to a colleague what ... is for ...").

The output is deterministic for a given Python version (sorted modules, fixed seed).

    python scripts/make_prompts.py --out traces/prompts --n 60
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import sys
import warnings
from pathlib import Path

MODULES = sorted(
    m
    for m in sys.stdlib_module_names
    if not m.startswith("_")
    and m not in {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3"}
)

NL_TEMPLATES = (
    "Explain to a colleague what the Python module `{m}` is for and when to use it. "
    'Its documentation starts: "{doc}"',
    'Write a short tutorial paragraph about `{m}` for a beginner. Documentation: "{doc}"',
    'Summarize in plain words what `{m}` does and give one practical example. Docs: "{doc}"',
)


def _modules() -> list[object]:
    mods = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in MODULES:
            try:
                mods.append(importlib.import_module(name))
            except Exception:
                continue
    return mods


def code_prompts(n: int, rng: random.Random) -> list[dict[str, str]]:
    cands = []
    for mod in _modules():
        for fname, fn in sorted(vars(mod).items()):
            if fname.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
                continue
            doc = inspect.getdoc(fn)
            try:
                sig = str(inspect.signature(fn))
            except (TypeError, ValueError):
                continue
            if not doc or len(doc) < 40 or len(doc) > 600:
                continue
            cands.append((mod.__name__, fname, sig, doc))
    rng.shuffle(cands)
    out = []
    for mod_name, fname, sig, doc in cands[:n]:
        body = "\n".join("    " + ln for ln in doc.splitlines())
        prompt = (
            f"Complete the body of this Python function (from `{mod_name}`). "
            f'Reply with code only.\n\ndef {fname}{sig}:\n    """\n{body}\n    """\n'
        )
        out.append({"id": f"code-{mod_name}.{fname}", "family": "code", "prompt": prompt})
    return out


def nl_prompts(n: int, rng: random.Random) -> list[dict[str, str]]:
    cands = []
    for mod in _modules():
        doc = inspect.getdoc(mod) or ""
        para = " ".join(doc.split("\n\n")[0].split())
        if 40 <= len(para) <= 500:
            cands.append((mod.__name__, para))
    rng.shuffle(cands)
    return [
        {"id": f"nl-{m}", "family": "nl", "prompt": NL_TEMPLATES[i % len(NL_TEMPLATES)].format(m=m, doc=d)}
        for i, (m, d) in enumerate(cands[:n])
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("traces/prompts"))
    ap.add_argument("--n", type=int, default=60, help="prompts per family")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for family, make in (("code", code_prompts), ("nl", nl_prompts)):
        rows = make(args.n, random.Random(args.seed))
        path = args.out / f"{family}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{path}: {len(rows)} prompts (python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
