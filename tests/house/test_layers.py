"""The house stays layered: no module imports a higher layer, no import circle, no CLI module
imports another (docs/architecture.md).

Every import counts, also those inside functions and under ``TYPE_CHECKING``: a lazy import that
runs back up is still a dependency that runs back up. The checker is tested on small synthetic
packages too, so a violation really fails it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

PACKAGE = ROOT / "wispsim"

# bottom to top; a module may import its own layer and the ones below it
LAYERS = (
    "", "config", "model", "sim", "analysis", "plots", "study", "engines", "measure", "serve", "runs", "cli",
)  # fmt: skip
# the highest layer the package face (``wispsim/__init__.py``) re-exports from
FACE_REACH = "analysis"
# a leaf layer imports only the root modules (errors, registry, paths, ...), whatever its rank
LEAVES = {"engines"}
# a tower: imported only by the layers named (and itself); nothing else may lean on it
TOWERS = {"measure": ("runs", "cli")}
# what ``from wispsim import NAME`` really imports (wispsim/__init__.py re-exports lazily)
REEXPORTS = {
    "load_scenario": "wispsim.sim.scenarios",
    "simulate": "wispsim.sim.simulation",
    "summarize": "wispsim.analysis.metrics",
}
# the only CLI modules other CLI modules may import
CLI_SHARED = {"wispsim.cli.common", "wispsim.cli.options"}
# heavy or front-end libraries and the only places that may import them (prefixes of module names)
EDGES = {
    "matplotlib": ("plots",),
    "typer": ("cli",),
    "rich": ("cli",),
    "torch": ("engines", "measure"),
    "transformers": ("engines", "measure"),
    "vllm": ("engines", "measure"),
    "sklearn": ("measure",),
    "xgboost": ("measure",),
    "lightgbm": ("measure",),
    "ray": ("study.runners",),
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, package: str) -> set[str]:
    """The package modules ``path`` imports (``from a import b`` counts as ``a.b`` when that is a
    module of the package, else as ``a``)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if mod.split(".")[0] != package:
                continue
            for a in node.names:
                if mod == package and a.name in REEXPORTS:
                    out.add(REEXPORTS[a.name])
                else:
                    out.add(f"{mod}.{a.name}")
                    out.add(mod)
    return out


def third_party(path: Path) -> set[str]:
    """Top-level names of the libraries ``path`` imports (anywhere in the file)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def _top(mod: str) -> str:
    """The layer folder of a module (``""`` for the root modules)."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""


def layer_of(mod: str) -> int:
    top = _top(mod)
    return LAYERS.index(top) if top in LAYERS else 0


def check(root: Path) -> list[str]:
    """All violations in the package at ``root``: upward imports, CLI cross-imports, circles."""
    package = root.name
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    problems = []
    for mod, path in files.items():
        deps = {d for d in imports_of(path, mod, package) if d in files and d != mod}
        graph[mod] = deps
        if mod == package:  # the top-level __init__ only re-exports, lazily, from low layers
            for d in sorted(deps):
                if layer_of(d) > layer_of(f"{package}.{FACE_REACH}"):
                    problems.append(f"the package face imports {d} (above {FACE_REACH})")
            continue
        inner = mod.split(".", 1)[1] if "." in mod else ""
        for lib in sorted(third_party(path) & set(EDGES)):
            if not any(inner == e or inner.startswith(e + ".") for e in EDGES[lib]):
                problems.append(f"{mod} imports {lib} (allowed only in {', '.join(EDGES[lib])})")
        if package in imports_of(path, mod, package):  # from wispsim import X: the face, back
            problems.append(f"{mod} imports the package face (import from the module that defines it)")
        for d in sorted(deps):
            if d == package:
                continue
            if layer_of(d) > layer_of(mod):
                problems.append(f"{mod} imports the higher layer {d}")
            top, dtop = _top(mod), _top(d)
            if top in LEAVES and dtop not in ("", top):
                problems.append(f"{mod} (a leaf: root modules only) imports {d}")
            if dtop in TOWERS and top != dtop and top not in TOWERS[dtop]:
                problems.append(f"{mod} imports {d} (the {dtop} tower: only {', '.join(TOWERS[dtop])} may)")
            cli = f"{package}.cli"
            if (
                mod.startswith(cli + ".")
                and d.startswith(cli + ".")
                and not mod.endswith((".main", ".__main__"))
                and d not in {c.replace("wispsim", package) for c in CLI_SHARED}
            ):
                problems.append(f"{mod} imports another CLI module {d}")
    # circles: strongly connected components of the import graph (package __init__s that only
    # re-export their own submodules are left out: importing a package runs its __init__ anyway)
    edges = {
        m: {d for d in ds if not (files[d].name == "__init__.py" and m.startswith(d + "."))}
        for m, ds in graph.items()
        if m != package
    }
    problems += [f"import circle: {' -> '.join(c)}" for c in circles(edges)]
    return problems


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one member (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_is_layered() -> None:
    problems = check(PACKAGE)
    assert not problems, "\n".join(problems)


def test_every_folder_is_a_known_layer() -> None:
    files = [p.relative_to(PACKAGE).parts for p in PACKAGE.rglob("*.py")]
    tops = {parts[0] for parts in files if len(parts) > 1}
    assert tops <= set(LAYERS), f"folders outside the layer list: {sorted(tops - set(LAYERS))}"


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "wispsim"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for d in {p.parent for p in root.rglob("*.py")}:
        (d / "__init__.py").touch()
    return root


CLEAN = {
    "errors.py": "",
    "config/schema.py": "from wispsim.errors import X\n",
    "model/memory.py": "from wispsim.config.schema import Scenario\n",
    "sim/simulation.py": "from wispsim.model import memory\n",
    "cli/common.py": "",
    "cli/run.py": "from wispsim.cli.common import console\nfrom wispsim.sim.simulation import simulate\n",
    "cli/main.py": "from wispsim.cli import run\n",
}


def test_checker_accepts_a_clean_package(tmp_path: Path) -> None:
    assert check(_package(tmp_path, CLEAN)) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # a model module reaching up into the simulator, even lazily inside a function
        (
            {"model/memory.py": "def f():\n    from wispsim.sim.simulation import simulate\n"},
            "wispsim.model.memory imports the higher layer wispsim.sim.simulation",
        ),
        # config checking plug-in names by importing the model's registries (the old circle)
        (
            {"config/schema.py": "from wispsim.model.memory import KVMemory\n"},
            "wispsim.config.schema imports the higher layer wispsim.model.memory",
        ),
        # the re-export at the top hides an upward import
        (
            {"config/schema.py": "from wispsim import simulate\n"},
            "wispsim.config.schema imports the higher layer wispsim.sim.simulation",
        ),
        # matplotlib outside plots/
        (
            {"sim/simulation.py": "def f():\n    import matplotlib.pyplot as plt\n"},
            "wispsim.sim.simulation imports matplotlib (allowed only in plots)",
        ),
        # one command module importing another
        (
            {"cli/run.py": "from wispsim.cli.main import app\n"},
            "wispsim.cli.run imports another CLI module wispsim.cli.main",
        ),
        # a circle inside one layer
        (
            {
                "sim/simulation.py": "from wispsim.sim import device\n",
                "sim/device.py": "import wispsim.sim.simulation\n",
            },
            "import circle: wispsim.sim.device -> wispsim.sim.simulation",
        ),
        # an engine (a leaf) reaching into the simulator's model
        (
            {"engines/vllm.py": "from wispsim.model import memory\n"},
            "wispsim.engines.vllm (a leaf: root modules only) imports wispsim.model.memory",
        ),
        # the real deployment leaning on the measurement tower
        (
            {"serve/app.py": "from wispsim.measure.profile import archs\n", "measure/profile/archs.py": ""},
            "wispsim.serve.app imports wispsim.measure.profile.archs (the measure tower: only runs, cli may)",
        ),
        # the entrance hall importing a command module
        (
            {"runs/run.py": "from wispsim.cli.run import run\n"},
            "wispsim.runs.run imports the higher layer wispsim.cli.run",
        ),
        # a root module importing the package face back (the version it re-exports): a loop
        (
            {"provenance.py": "from wispsim import __version__\n"},
            "wispsim.provenance imports the package face (import from the module that defines it)",
        ),
        # the package face reaching into the entrance hall
        (
            {"__init__.py": "def f():\n    from wispsim.runs.run import run\n", "runs/run.py": ""},
            "the package face imports wispsim.runs.run (above analysis)",
        ),
    ],
)
def test_checker_catches_a_deliberate_violation(
    tmp_path: Path, change: dict[str, str], expected: str
) -> None:
    problems = check(_package(tmp_path, {**CLEAN, **change}))
    assert expected in problems, problems
