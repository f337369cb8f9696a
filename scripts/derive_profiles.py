"""Regenerate the shipped derived profiles: those scaled from the published A100 Qwen3-32B profile,
and the physical (roofline) ones with the calibrated vLLM parameters (wispsim/data/roofline.yaml).

    python scripts/derive_profiles.py            # writes profiles/<name>.yaml for each
    python scripts/derive_profiles.py --check    # exits 1 if a shipped file is out of date

Each file is what ``wispsim profile derive`` writes with the arguments in
``wispsim.measure.profile.derive.SHIPPED`` (the command is recorded in the file); the rule is explained
in docs/profiles.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

from wispsim.measure.profile.derive import GROUNDED, SHIPPED, derive_named, render, roofline_named

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    made = [(n, derive_named(name=n, **a)) for n, a in SHIPPED.items()]
    made += [(n, roofline_named(name=n, **a)) for n, a in GROUNDED.items()]
    for name, prof in made:
        text = render(prof)
        path = ROOT / "profiles" / f"{name}.yaml"
        if check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python scripts/derive_profiles.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
