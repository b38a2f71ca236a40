"""The import rules of docs/architecture.md, checked so they keep holding:

- layers only point down: every module of rlfarm imports only modules of its own layer or of lower
  ones (`LAYERS`, lowest first, by package: rlfarm.<name>), lazy imports inside functions included;
- the pure layers (rlfarm.config, core, envs, nn, algos) import nothing that does I/O: no Redis,
  Celery or kombu, nothing of rlfarm's I/O layers, not even through what they import;
- the trainer side (rlfarm.trainer, api) never imports the worker side (rlfarm.worker)
  nor `tasks`, and the protocol both sides speak (rlfarm.farm) never imports rlfarm.worker;
- `rlfarm` never imports `tasks` or `cli` (the checkout's entry point; the command is rlfarm.cli);
- no import cycles between rlfarm's modules, lazy imports inside functions included (imports for type
  checkers only, under `if TYPE_CHECKING:`, are not imports at run time and do not count).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap

import pytest

from rlfarm.config import ALGORITHMS

from .conftest import ROOT

PURE_LAYERS = [
    "errors",
    "sections",
    "config",
    "core",
    "envs",
    "nn",
    "algos",
]  # one layer: they compute, and import each other
FACE = ["api", "rlfarm"]  # the package's face: rlfarm.api and the package itself (rlfarm/__init__.py)
# Lowest first: a module imports only modules of its own layer or of a lower one.
LAYERS = [
    PURE_LAYERS,
    ["runio"],  # the lowest I/O: the run directory, logs, the console's width, the Prometheus exporter
    ["farm"],  # what the trainer and the workers both speak: Redis, Celery's app, finding the farm
    ["worker"],  # what a worker does
    ["evaluation"],  # evaluation's bookkeeping, playing a policy (`rlfarm eval`), rlfarm.load
    ["observe"],  # the trainer's sinks: metrics, MLflow, video
    ["trainer"],
    ["local"],  # the embedded cluster, `rlfarm up`: starts workers
    FACE,
    ["tune"],  # seeds and sweeps: trainers as `rlfarm train` subprocesses
    ["commands"],  # the commands' back-ends beyond mapping flags: status, watch, plot
    ["cli"],
]
IO_LAYERS = [name for layer in LAYERS[1:] for name in layer if layer is not FACE]


def _layer(module: str) -> int:
    """The rank in LAYERS of an rlfarm module's layer (its package under rlfarm; rlfarm itself: the face)."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else parts[0]
    return next(rank for rank, layer in enumerate(LAYERS) if name in layer)


def _module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted((ROOT / "rlfarm").rglob("*.py"))}
PURE = sorted(m for m in MODULES if m.split(".")[1:2] and m.split(".")[1] in PURE_LAYERS)
FORBIDDEN_FOR_PURE = [
    "redis",
    "celery",
    "kombu",
    "tensorboard",
    "tasks",
    "cli",
    "rlfarm.api",
    *(f"rlfarm.{layer}" for layer in IO_LAYERS),
]


def test_every_module_is_in_a_layer():
    """One level deep: every module but the package's own face (rlfarm, rlfarm.api) sits in a layer."""
    loose = [m for m in MODULES if m not in ("rlfarm", "rlfarm.api") and m.split(".")[1] not in PURE_LAYERS + IO_LAYERS]
    assert not loose, loose
    names = [name for layer in LAYERS for name in layer]
    assert len(names) == len(set(names)), names  # each package in one layer
    assert all(m.count(".") <= 3 for m in MODULES), [m for m in MODULES if m.count(".") > 3]


def import_with_forbidden(modules: list[str], forbidden: list[str]) -> dict:
    """Import `modules` in a fresh interpreter where importing any of `forbidden` (or a submodule of
    one) raises; returns {module: error or None} and the rlfarm modules that ended up imported."""
    script = textwrap.dedent(f"""
        import importlib, json, sys
        FORBIDDEN = {forbidden!r}

        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                    raise ImportError(f"forbidden import: {{name}}")
                return None

        sys.meta_path.insert(0, Refuse())
        errors = {{}}
        for module in {modules!r}:
            try:
                importlib.import_module(module)
                errors[module] = None
            except ImportError as exc:
                errors[module] = str(exc)
        print(json.dumps({{"errors": errors, "loaded": sorted(m for m in sys.modules if m.startswith("rlfarm"))}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.process  # one interpreter per module, so imports are seen from scratch
def test_pure_modules_import_nothing_that_does_io():
    result = import_with_forbidden(PURE, FORBIDDEN_FOR_PURE)
    assert result["errors"] == dict.fromkeys(PURE), result["errors"]


@pytest.mark.process
def test_the_rule_check_itself_catches_a_forbidden_import():
    result = import_with_forbidden(["rlfarm.farm.policies.store"], ["redis"])  # the store talks to Redis
    assert "forbidden import: redis" in result["errors"]["rlfarm.farm.policies.store"]


TRAINER_SIDE = [m for m in MODULES if m.startswith("rlfarm.trainer")] + ["rlfarm.api"]
SHARED_PROTOCOL = [m for m in MODULES if m == "rlfarm.farm" or m.startswith("rlfarm.farm.")]


@pytest.mark.process
def test_the_trainer_side_never_imports_the_worker():
    result = import_with_forbidden(TRAINER_SIDE, ["rlfarm.worker", "tasks"])
    assert result["errors"] == dict.fromkeys(TRAINER_SIDE), result["errors"]


@pytest.mark.process
def test_the_shared_protocol_never_imports_the_worker():
    """rlfarm.farm is what the trainer and the workers both speak: the worker side depends on it, never
    the other way round."""
    result = import_with_forbidden(SHARED_PROTOCOL, ["rlfarm.worker", "tasks"])
    assert result["errors"] == dict.fromkeys(SHARED_PROTOCOL), result["errors"]


@pytest.mark.parametrize("module", sorted(set(TRAINER_SIDE + SHARED_PROTOCOL)))
def test_no_lazy_import_of_the_worker_from_the_trainer_side_or_the_protocol(module):
    """The two tests above see what importing a module imports; an import inside a function counts too
    (`from rlfarm import worker` included)."""
    names = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    bad = {n for n in names if n == "rlfarm.worker" or n.startswith("rlfarm.worker.")}
    assert not bad, f"{module} imports {sorted(bad)}"


def _imported_names(path) -> set[str]:
    """Every module an `import` or `from ... import` statement names, at any depth of the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "rlfarm").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_rlfarm_never_imports_tasks_or_cli(path):
    bad = {n for n in _imported_names(path) if n.split(".")[0] in ("tasks", "cli")}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_no_algorithm_switch_outside_algos():
    """The registry answers which algorithm does what: no `algo == "..."` outside rlfarm/algos/ (the
    command, rlfarm/cli/, included)."""
    offenders = []
    outside = [p for m, p in MODULES.items() if not m.startswith("rlfarm.algos")]
    for path in [*outside, ROOT / "cli.py", ROOT / "tasks" / "__init__.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
                sides = [node.left, *node.comparators]
                names = {ast.unparse(s) for s in sides}
                strings = {s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)}
                if strings & set(ALGORITHMS) and any("algo" in n for n in names):
                    offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` outside `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the rlfarm modules it imports anywhere in its file at run time (`from pkg import sub`
    names the submodule when there is one)."""
    graph = {}
    for name, path in MODULES.items():
        edges = set()
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in MODULES}
            elif isinstance(node, ast.ImportFrom) and node.module in MODULES and node.level == 0:
                edges |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                    for a in node.names
                }
        graph[name] = edges - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert _cycles(_import_graph()) == []


def _below(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports at run time, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_config_and_the_algorithms_import_each_other_one_way():
    """Issue 52 (decision 34): an algorithm's section (`algos/<name>/config.py`) stands on
    rlfarm.sections alone, so config/run.py imports it as a leaf and the learners read RunConfig: no
    chain of run-time imports leads from a section back into rlfarm.config or a learner. Before, a
    section imported rlfarm.config's base modules, whose package imported the section back half made."""
    graph = _import_graph()
    sections = [m for m in MODULES if re.fullmatch(r"rlfarm\.algos\.\w+\.config", m)]
    assert len(sections) >= 4, sections
    for module in [*sections, *(m for m in MODULES if m.startswith("rlfarm.sections"))]:
        reached = _below(graph, module)
        assert reached <= {m for m in MODULES if m.startswith(("rlfarm.sections", "rlfarm.errors"))}, (
            module,
            sorted(reached),
        )
    config_into_algos = {
        t for m in graph if m.startswith("rlfarm.config") for t in graph[m] if t.startswith("rlfarm.algos")
    }
    assert config_into_algos == set(sections)


@pytest.mark.process  # a fresh interpreter, so imports are seen from scratch
def test_importing_a_section_loads_no_config():
    """The fragility the loop had: importing an algorithm's section loaded rlfarm.config, which
    imported the section back before it was made. Now it loads the section's base and nothing else."""
    code = (
        "import sys, rlfarm.algos.ppo.config, rlfarm.algos.td3.config; "
        "print(sorted(m for m in sys.modules if m.startswith('rlfarm.config') or m.startswith('rlfarm.nn')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports in `graph` of a module of a higher layer than the importer's."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if _layer(t) > _layer(m))


def test_layers_only_point_down():
    """Every module imports only modules of its own layer or lower ones (LAYERS), lazy imports inside
    functions included; imports for type checkers only (`if TYPE_CHECKING:`) do not count."""
    assert _upward(_import_graph()) == []


def test_the_layer_check_itself_finds_an_import_upward():
    assert _upward(
        {
            "rlfarm.farm.claim": {"rlfarm.observe.metrics", "rlfarm.runio.rundir"},
            "rlfarm.worker.hooks": {"rlfarm"},
            "rlfarm.cli": {"rlfarm.api"},
        }
    ) == ["rlfarm.farm.claim -> rlfarm.observe.metrics", "rlfarm.worker.hooks -> rlfarm"]


def test_the_cycle_check_itself_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _string_starts(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value)
    return None


def test_only_the_keys_module_names_redis_keys():
    """rlfarm.farm.keys owns the layout: no other module spells out an `rlfarm:...` key (docstrings
    may describe them; `rlfarm: ` with a space is the console's prefix, not a key)."""
    offenders = []
    for path in [*MODULES.values(), ROOT / "cli.py", ROOT / "tasks" / "__init__.py"]:
        if path == MODULES["rlfarm.farm.keys"]:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            text = _string_starts(node)
            if text and id(node) not in docstrings and text.startswith("rlfarm:") and not text.startswith("rlfarm: "):
                offenders.append(f"{path.name}:{node.lineno}: {text[:40]!r}")
    assert not offenders, offenders


MAX_LINES = 450  # a module a newcomer reads in one sitting (issue 34)


def test_no_module_is_longer_than_a_sitting():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by what they do): {long}"


def _all_import_graph(prefix: str) -> dict[str, set[str]]:
    """Module -> the modules under `prefix` it imports anywhere, type checkers' imports included."""
    graph = {}
    for name, path in MODULES.items():
        if not name.startswith(prefix):
            continue
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                    for a in node.names
                }
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
        graph[name] = {e for e in edges if e.startswith(prefix) and e in MODULES} - {name}
    return graph


def test_no_import_circles_inside_the_trainer_not_even_for_type_checkers():
    """The trainer's parts import each other one way (issue 52: channel, the old keeper, the outbox and
    the watchdog were a circle through a type checker's import and `warn`): the ledger and the outbox
    (dispatch.py) below the watchdog, the watchdog below the channel, the channel below the trainer."""
    assert _cycles(_all_import_graph("rlfarm.trainer.")) == []


def test_a_trainer_is_one_class_and_its_mode_not_mixins():
    """Trainer answers its channel as RunOwner itself and holds its parts as objects (issue 52: it was
    Evaluating + RunKeeper mixins, one class in five files re-declaring each other's attributes)."""
    from rlfarm.trainer.asynchronous import AsyncTrainer
    from rlfarm.trainer.base import Trainer
    from rlfarm.trainer.sync import SyncTrainer

    assert Trainer.__bases__ == (object,)
    for mode in (SyncTrainer, AsyncTrainer):
        assert mode.__bases__ == (Trainer,), mode


# Wiring, not records: a class whose constructor is written by hand takes at most this many
# parameters; what travels together is grouped (issue 52). Dataclasses that are records (a config
# section, a result, a row) are data, not wiring, and are not counted.
MAX_CONSTRUCTOR_PARAMETERS = 8


def _wide_constructors(sources: dict[str, str]) -> list[str]:
    """`module.Class: n` for each hand-written constructor of more than MAX_CONSTRUCTOR_PARAMETERS."""
    wide = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = item.args
                    count = len(args.posonlyargs) + len(args.args) - 1 + len(args.kwonlyargs)
                    if count > MAX_CONSTRUCTOR_PARAMETERS:
                        wide.append(f"{name}.{node.name}: {count}")
    return sorted(wide)


def test_no_constructor_takes_more_than_eight_parameters():
    """Trainer took 17, LocalCluster 14, Sweep 11, Outbox 10 (issue 52): what travels together is one
    parameter now (LearningParts, FarmParts, RunIO; RedisSpec; SweepPlan; the claim)."""
    assert _wide_constructors({name: path.read_text() for name, path in MODULES.items()}) == []


def test_the_constructor_check_itself_counts_every_kind_of_parameter():
    wide = "class A:\n    def __init__(self, a, /, b, c=1, *, d, e, f, g, h, i):\n        pass\n"
    narrow = "class B:\n    def __init__(self, a, b, c, *, d, e, f, g, h):\n        pass\n"
    assert _wide_constructors({"m": wide, "n": narrow}) == ["m.A: 9"]


# The errors private to one module: raised and caught there, never seen by a user.
PRIVATE_ERRORS = {
    "rlfarm.local.cluster.PortTaken": "start_redis's signal to try another port",
    "rlfarm.cli.common._UsageLine": "click's usage error as one line",
    "rlfarm.tune.seeds.StartFailed": "a seed's trainer that could not start: the seeds command says so itself",
    "rlfarm.worker.hooks.TaskFailed": "Celery's record of a task already answered in Redis",
    "rlfarm.worker.handler.HandedBack": "SIGUSR2 in a pool process, turned into the task's answer",
}


def test_every_public_error_is_in_rlfarm_errors_under_one_base_class():
    import builtins

    from rlfarm import errors

    builtin = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)}
    stray = []
    for name, path in MODULES.items():
        if name == "rlfarm.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                is_error = any(b.endswith(("Error", "Exception")) or b in builtin and b != "object" for b in bases)
                if is_error and f"{name}.{node.name}" not in PRIVATE_ERRORS and "Protocol" not in bases:
                    stray.append(f"{name}.{node.name}")
    assert not stray, f"errors outside rlfarm/errors.py: {stray}"
    classes = [c for c in vars(errors).values() if isinstance(c, type) and c.__module__ == "rlfarm.errors"]
    assert len(classes) > 30
    assert all(issubclass(c, errors.RlfarmError) for c in classes)
