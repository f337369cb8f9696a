"""The simulator's hot path compiled with mypyc, optionally: which modules, and whether to use them.

``python scripts/compile.py`` compiles :data:`MODULES` in place -- a C extension beside each
source and one shared library, ``wispsim_native__mypyc``, beside the package -- and writes
``wispsim/native.json`` with the hash of each source it compiled (the modules a build in place
compiled are the ones it lists, which may be an earlier version's). Python then imports an
extension before the source of the same name; :func:`install`, run once when :mod:`wispsim` is
imported, decides whether it may: where a source has changed since the build, or where
``WISPSIM_PURE=1`` asks for it, every compiled module loads from its source instead (compiled
modules call each other natively, so it is all of them or none), and a changed source says so
in one line on stderr (unless the pure Python was asked for). The numbers are the same either
way (a test compiles a copy and compares a run's records bit for bit); only the time per round
differs (benchmarks/README.md).

The modules are the round's path: a device's round, the front end's queue, the verifier's loop,
the recorder's packed rows, WISP's batch selection, the batch and KV accounting, the roofline's
prices, drafting. A round's verdict (``sim/verdict.py``) stays interpreted: it is a SimPy event (a
subclass of an interpreted class), as SimPy's own loop does. A compiled class that
interpreted code subclasses says so (``mypyc_attr(allow_interpreted_subclasses=True)``: the cost
forms' base, which the estimator forms extend, and the KV memory).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from pathlib import Path
from types import ModuleType

MODULES = (
    "wispsim.sim.round",
    "wispsim.sim.device",
    "wispsim.sim.front",
    "wispsim.sim.inbox",
    "wispsim.sim.verifier",
    "wispsim.sim.recorder",
    "wispsim.model.batch",
    "wispsim.model.memory",
    "wispsim.model.schedulers.wisp",
    "wispsim.model.roofline",
    "wispsim.model.cost",
    "wispsim.model.drafting",
    "wispsim.model.network",
    "wispsim.model.noise",
    "wispsim.model.verifier_kinds",
    "wispsim.model.host_cpu",
    "wispsim.model.admission",
)
GROUP = "wispsim_native"  # the shared library's name (mypyc's group)
PACKAGE = Path(__file__).resolve().parent
MANIFEST = PACKAGE / "native.json"
PURE_ENV = "WISPSIM_PURE"
EXTENSION = EXTENSION_SUFFIXES[0]  # this interpreter's name for an extension module


def source(name: str, package: Path = PACKAGE) -> Path:
    """The source file of module ``name`` (a dotted name under ``wispsim``)."""
    return package.joinpath(*name.split(".")[1:]).with_suffix(".py")


def source_hash(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def pure_asked() -> bool:
    """``WISPSIM_PURE`` set to anything but 0."""
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def state(package: Path = PACKAGE) -> tuple[str, str]:
    """("compiled" | "stale" | "pure" | "none", why) for the package at ``package`` as it is on
    disk now: no build; a build whose sources have not changed and whose files for this Python
    are all there (used unless ``WISPSIM_PURE=1``: "pure"); or one that is not (what is amiss).
    What this process runs was decided once, at import: :func:`used`."""
    try:
        built = compiled(package)
        changed = [n for n, h in built.items() if h != source_hash(source(n, package))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return "stale", f"{MANIFEST.name} unreadable ({e})"
    if not built:
        return "none", "not compiled (python scripts/compile.py)"
    if changed:
        return "stale", "changed since the build: " + ", ".join(n.rsplit(".", 1)[1] for n in changed)
    # this interpreter's extensions, and the library they share (a build for another Python, or
    # one with a file removed, would load in part or not at all)
    files = [source(n, package).with_suffix(EXTENSION) for n in built]
    files.append(package.parent / f"{GROUP}__mypyc{EXTENSION}")
    if not all(f.is_file() for f in files):
        return "stale", f"its files for this Python ({EXTENSION}) are not all there"
    if pure_asked():
        return "pure", f"{PURE_ENV}={os.environ[PURE_ENV]}"
    return "compiled", f"{len(built)} modules (mypyc)"


def compiled(package: Path = PACKAGE) -> dict[str, str]:
    """The modules the build in place compiled, with their sources' hashes then ({}: none)."""
    manifest = package / MANIFEST.name
    if not manifest.is_file():
        return {}
    import json

    return {str(k): str(v) for k, v in json.loads(manifest.read_text())["sources"].items()}


class _SourcesFirst:
    """A meta path finder: loads every wispsim module that has an extension beside its source
    (whatever build left it) from the source."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not fullname.startswith("wispsim."):
            return None
        src = source(fullname)
        if not src.with_suffix(EXTENSION).is_file():
            return None
        from importlib.util import spec_from_file_location

        return spec_from_file_location(fullname, src)


_USED: tuple[str, str] | None = None  # what install() decided for this process


def install() -> None:
    """Use the compiled modules only where they are current and wanted (module text)."""
    global _USED
    if _USED is not None:
        return
    _USED = how, why = state()
    if how in ("stale", "pure"):
        sys.meta_path.insert(0, _SourcesFirst())
        if how == "stale" and not pure_asked() and not os.environ.get("WISPSIM_NATIVE_SAID"):
            os.environ["WISPSIM_NATIVE_SAID"] = "1"  # once: worker processes inherit it
            print(
                f"wispsim: compiled modules not used, {why}; rerun python scripts/compile.py (or --clean)",
                file=sys.stderr,
            )


def used() -> tuple[str, str]:
    """What this process runs, as decided when wispsim was imported: ("compiled", why) or the
    reason it runs the pure Python (:func:`state`'s values). Provenance records this, not the
    files as they are later (a source edited mid-run does not unload the build)."""
    install()
    assert _USED is not None
    return _USED
