"""No module of fedbench imports from a layer above its own (issue 22: no backward imports), and no two modules
import each other, directly or round a longer circle (issue 55: each circle was a concept split across two files).

The layers, bottom to top (a module may import its own layer and the layers below it):

  foundation   errors, checks (config value checks), seeding, preemption, hydra_cache (a parse cache for Hydra's
               config files), confdir (where the configuration lives: conf/, --config-dir, the config groups):
               import nothing of fedbench but each other
  files        files (atomic writes), plots (pictures): the algorithms' diagnostics write with them
  blocks       data (datasets, partitions), models (networks and their registry)
  engine       the local-training loop, optimizers, stacked models (engine/functional.py runs the models), the fp32
               agreement rule between executors (engine/agreement.py: scripts/gpu_correctness.py imports it too)
  shared       context (what an algorithm may use of its run), distributed (a run's processes: the context splits
               training and prediction over them), losses, prototypes, metrics, forgetting (FedKA's class groups and
               forgetting degree: FedKA trains with them, the forgetting monitor measures them)
  algo-base    algorithms/base.py, the Algorithm interface, and algorithms/local.py (LocalSpec), which it uses
  algorithms   the registry and the methods (oneshot.py below ecl/lws/tau_norm/fedafa only by convention)
  monitors     evaluation, similarity, newclients, console, loggers: they run algorithms and report on them
  config       the run config's checks and the registry checks (imports the registries)
  run          build, run, callbacks, checkpoint, runlock, rundir: a run put together from its config, its dir's
               lock and lifecycle
  report       fedbench-report, fedbench-tables: tables and figures from run dirs, runtime estimates
  claims       fedbench-claims: the papers' claims run and judged (reads runs with report's readers)
  top          the package itself (registers config's resolvers), __main__ (python -m fedbench), overrides (the
               command line's checks), cli, sweep

Every import counts: top-level, lazy (inside a function) and typing-only ones. Within a layer a module may import
another of its layer, but never round a circle: no module imports one that (through others) imports it back — a
registry lists its members rather than being imported by them (models/__init__.py), a package's __init__ is not
imported by its own modules. A module missing from the map fails the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "fedbench"

LAYERS: list[tuple[str, tuple[str, ...]]] = [  # bottom to top; names under fedbench ("" = the package itself)
    ("foundation", ("errors", "checks", "seeding", "preemption", "provenance", "hydra_cache", "confdir")),
    ("files", ("files", "plots")),
    ("blocks", ("data", "models")),
    ("engine", ("engine", "engine.agreement")),
    (
        "shared",
        ("context", "distributed", "losses", "prototypes", "metrics", "forgetting", "communication", "protocol"),
    ),
    ("algo-base", ("algorithms.base", "algorithms.local")),
    ("algorithms", ("algorithms",)),
    ("monitors", ("evaluation", "similarity", "newclients", "console", "loggers")),
    ("config", ("config",)),
    ("run", ("build", "run", "callbacks", "checkpoint", "rundir", "runlock")),
    ("report", ("report",)),
    ("claims", ("claims",)),
    ("top", ("", "__main__", "cli", "overrides", "sweep")),
]

# Backward imports that another change of issue 22 removes: (importer, imported) -> why it is still here. An entry
# whose import is gone fails the test: delete it then.
KNOWN: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the longest listed name that is ``module`` or a package holding it (not the root)."""
    best, depth = None, -1
    for i, (_, names) in enumerate(LAYERS):
        for name in names:
            full = "fedbench" + (f".{name}" if name else "")
            if (module == full or (name and module.startswith(full + "."))) and len(full) > depth:
                best, depth = i, len(full)
    return best


def imports(module: str) -> list[tuple[int, str, str]]:
    """(line, imported fedbench module, imported names) of every import in ``module``'s file, at any depth."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, "") for a in node.names if a.name.split(".")[0] == "fedbench"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "fedbench":
                continue
            for a in node.names:  # `from . import seeding` imports the module fedbench.seeding
                target = f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source
                out.append((node.lineno, target, a.name))
    return out


def backward_imports() -> list[tuple[str, str, str]]:
    """(importer, imported, 'file:line imports X (layer) from layer Y') for every import of a higher layer."""
    found = []
    for module, path in MODULES.items():
        mine = layer_of(module)
        for line, target in sorted({(line, target) for line, target, _ in imports(module)}):
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(
                    (
                        module,
                        target,
                        f"{path.relative_to(REPO)}:{line} imports {target} (layer "
                        f"{LAYERS[theirs][0]}) from layer {LAYERS[mine][0]}",
                    )
                )
    return found


def graph() -> dict[str, dict[str, int]]:
    """{importer: {imported module: first line}} over every import of every module (a module's import of itself, e.g.
    a package's ``from . import x`` of its own name, aside)."""
    out: dict[str, dict[str, int]] = {}
    for module in MODULES:
        edges = out.setdefault(module, {})
        for line, target, _ in imports(module):
            if target != module and target in MODULES:
                edges[target] = min(line, edges.get(target, line))
    return out


def circles(edges: dict[str, set | dict]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative): the sets of modules
    each of which imports (through the others) every other one. Sorted, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_modules_import_each_other():
    """No circle in the import graph, lazy imports included: two files that need each other hold one concept split
    in two (or one in the wrong file); each circle is printed with the lines that close it."""
    g = graph()
    bad = []
    for circle in circles(g):
        inside = set(circle)
        arrows = [
            f"  {MODULES[a].relative_to(REPO)}:{g[a][b]} imports {b}"
            for a in circle
            for b in sorted(g[a])
            if b in inside
        ]
        bad.append(f"{', '.join(circle)}:\n" + "\n".join(arrows))
    assert not bad, f"{len(bad)} import circles:\n" + "\n".join(bad)


def test_the_circle_finder_finds_circles_of_any_length_and_only_them():
    """a -> b -> c -> a is one circle, d <-> e another; f imports into a circle and g is imported by one, but neither
    is in one; h imports itself, which is no circle of modules."""
    edges = {"a": {"b"}, "b": {"c", "g"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a", "d"}, "g": set(), "h": {"h"}}
    assert circles(edges) == [["a", "b", "c"], ["d", "e"]]
    assert circles({k: v for k, v in edges.items() if k != "c"} | {"c": set()}) == [["d", "e"]]


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if layer_of(m) is None)
    assert not missing, f"modules with no layer in tests/test_layers.py LAYERS: {missing}"


def test_no_module_imports_from_a_layer_above_its_own():
    bad = [msg for importer, target, msg in backward_imports() if (importer, target) not in KNOWN]
    assert not bad, f"{len(bad)} backward imports:\n" + "\n".join(bad)


def test_known_backward_imports_still_exist():
    present = {(importer, target) for importer, target, _ in backward_imports()}
    stale = sorted(set(KNOWN) - present)
    assert not stale, f"these imports are gone: delete them from KNOWN in tests/test_layers.py: {stale}"


def test_algorithms_import_no_private_names_of_other_modules():
    """An algorithm uses another module's public helpers only (ecl.py imported engine.functional's ``_sub``)."""
    bad = [
        f"{MODULES[m].relative_to(REPO)}:{line} imports {name} from {target}"
        for m in MODULES
        if m.startswith("fedbench.algorithms")
        for line, target, name in imports(m)
        if name.startswith("_") and target != m
    ]
    assert not bad, "\n".join(bad)


def test_the_layer_check_sees_lazy_relative_and_absolute_imports():
    """The parser behind the checks: a lazy relative import and an absolute one, resolved to their modules."""
    path = PACKAGE / "engine" / "functional.py"
    found = {target for _, target, _ in imports("fedbench.engine.functional")}
    assert "fedbench.models" in found and "fedbench.engine.masking" in found, (path, found)
    lazy = {(target, name) for _, target, name in imports("fedbench.config")}
    assert ("fedbench.algorithms", "ALGORITHMS") in lazy  # inside validate()
    assert ("fedbench.errors", "ConfigError") in {(t, n) for _, t, n in imports("fedbench.data.datasets")}  # absolute
    assert layer_of("fedbench.algorithms.base") < layer_of("fedbench.algorithms.ecl") < layer_of("fedbench.config")
