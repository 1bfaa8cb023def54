"""No module of fedbench imports from a layer above its own (issue 22: no backward imports).

The layers, bottom to top (a module may import its own layer and the layers below it):

  foundation   errors, checks (config value checks), seeding, preemption, hydra_cache (a parse cache for Hydra's
               config files): import nothing of fedbench but each other
  files        files (atomic writes), plots (pictures): the algorithms' diagnostics write with them
  blocks       data (datasets, partitions), models (networks and their registry)
  engine       the local-training loop, optimizers, stacked models (engine/functional.py runs the models), the fp32
               agreement rule between executors (engine/agreement.py: scripts/gpu_check.py imports it too)
  shared       context (what an algorithm may use of its run), distributed (a run's processes: the context splits
               training and prediction over them), losses, prototypes, metrics, forgetting (FedKA's class groups and
               forgetting degree: FedKA trains with them, the forgetting monitor measures them)
  algo-base    algorithms/base.py, the Algorithm interface, and algorithms/local.py (LocalSpec), which it uses
  algorithms   the registry and the methods (oneshot.py below ecl/lws/tau_norm/fedafa only by convention)
  monitors     evaluation, similarity, newclients, console, loggers: they run algorithms and report on them
  config       the run config's checks and the registry checks (imports the registries)
  run          build, run, callbacks, checkpoint, rundir: a run put together from its config, its dir's lifecycle
  top          the package itself (registers config's resolvers), __main__ (python -m fedbench), cli, sweep, report,
               claims

Every import counts: top-level, lazy (inside a function) and typing-only ones. Within a layer imports are free
(the registries import their members, which import the registry). A module missing from the map fails the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "fedbench"

LAYERS: list[tuple[str, tuple[str, ...]]] = [  # bottom to top; names under fedbench ("" = the package itself)
    ("foundation", ("errors", "checks", "seeding", "preemption", "provenance", "hydra_cache")),
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
    ("run", ("build", "run", "callbacks", "checkpoint", "rundir")),
    ("top", ("", "__main__", "cli", "sweep", "report", "claims")),
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
