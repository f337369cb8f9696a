"""Compile the simulator's hot path with mypyc (optional; needs mypy and a C compiler).

    python scripts/compile.py            # build in place (~40 s on 2 cores)
    python scripts/compile.py --clean    # remove the build: pure Python again
    python scripts/compile.py --root DIR # the wispsim package under DIR (a copy: the tests')

Compiles :data:`wispsim.native.MODULES` beside their sources and writes ``wispsim/native.json``
(the hash of each source compiled), which :mod:`wispsim.native` checks at import: a module
changed since the build makes wispsim run pure Python again, and say so, until this is rerun.
The build runs in a scratch folder with its own mypy settings: the compiled modules must type-
check clean; the modules they import are read for their types only. ``WISPSIM_PURE=1`` runs the
pure Python with a build in place.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# this script reads the module list only: no word about the build it is about to replace
os.environ.update(WISPSIM_PURE="1", WISPSIM_NATIVE_SAID="1")

from wispsim.native import GROUP, MANIFEST, MODULES, source, source_hash  # noqa: E402

SETUP = """\
from mypyc.build import mypycify
from setuptools import setup

setup(name="{group}", packages=[], ext_modules=mypycify({paths!r}, opt_level="3", group_name="{group}"))
"""


def built(root: Path) -> list[Path]:
    """The files a build leaves under ``root`` (the folder holding ``wispsim/``): every extension
    in the package (an earlier build's module list may differ), the shared library, the manifest."""
    pkg = root / "wispsim"
    return sorted(pkg.rglob("*.so")) + sorted(root.glob(f"{GROUP}__mypyc.*.so")) + [pkg / MANIFEST.name]


def clean(root: Path) -> None:
    for p in built(root):
        p.unlink(missing_ok=True)


def mypy_ini() -> str:
    # the compiled modules type-check clean; the rest are read for their types only
    lines = ["[mypy]", "python_version = 3.11", "ignore_missing_imports = True", "",
             "[mypy-wispsim.*]", "ignore_errors = True", ""]  # fmt: skip
    for n in MODULES:
        lines += [f"[mypy-{n}]", "ignore_errors = False", ""]
    return "\n".join(lines)


def build(root: Path) -> None:
    pkg = root / "wispsim"
    clean(root)
    print(f"compiling {len(MODULES)} modules with mypyc (about 30-40 s on 2 cores) ...", flush=True)
    before = {n: source_hash(source(n, pkg)) for n in MODULES}
    with tempfile.TemporaryDirectory(prefix="wispsim-compile-") as tmp:
        work = Path(tmp)
        (work / "wispsim").symlink_to(pkg, target_is_directory=True)
        (work / "mypy.ini").write_text(mypy_ini())
        paths = [str(source(n, Path("wispsim"))) for n in MODULES]
        (work / "setup.py").write_text(SETUP.format(group=GROUP, paths=paths))
        log = work / "build.log"
        with log.open("w") as f:
            env = {**os.environ, "PYTHONPATH": ""}
            done = subprocess.run(
                [sys.executable, "setup.py", "build_ext", "--inplace"], cwd=work, stdout=f, stderr=f, env=env
            )
        if done.returncode != 0:
            clean(root)
            tail = log.read_text().strip().splitlines()[-15:]
            sys.exit("compile: the mypyc build failed; its last lines:\n" + "\n".join(tail))
        for lib in work.glob(f"{GROUP}__mypyc.*.so"):
            shutil.move(str(lib), root / lib.name)
    after = {n: source_hash(source(n, pkg)) for n in MODULES}
    if after != before:
        clean(root)
        sys.exit("compile: sources changed during the build; run it again")
    import mypy.version

    manifest = {"sources": after, "mypy": mypy.version.__version__, "python": sys.version.split()[0]}
    (pkg / MANIFEST.name).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"compiled {len(MODULES)} modules under {pkg} (wispsim/native.json; --clean removes them)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the folder holding wispsim/ (default: here)")
    ap.add_argument("--clean", action="store_true", help="remove the build: pure Python again")
    args = ap.parse_args()
    root = args.root.resolve()
    if not (root / "wispsim" / "__init__.py").is_file():
        ap.error(f"--root: {root} holds no wispsim package (give the folder that holds wispsim/)")
    if args.clean:
        clean(root)
        print(f"removed the compiled modules under {root / 'wispsim'}")
        return
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        sys.exit("compile: mypyc is not installed (pip install mypy: it ships mypyc)")
    build(root)


if __name__ == "__main__":
    main()
