"""The import rules of docs/architecture.md, checked so they keep holding:

- pure modules (config, codec, envs, atari, policy, rollout, replay, protocol, signing, algos) import
  nothing that does I/O: no Redis, Celery or kombu, no store, worker, dispatcher, checkpoint writer,
  metrics or cluster, not even through what they import;
- the trainer side never imports the worker module;
- `rlfarm` never imports `tasks` or `cli`.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest

from rlfarm.config import ALGORITHMS

from .conftest import ROOT

PURE = ["rlfarm.config", "rlfarm.codec", "rlfarm.envs", "rlfarm.atari", "rlfarm.normalize", "rlfarm.policy", "rlfarm.rollout", "rlfarm.replay",
        "rlfarm.protocol", "rlfarm.signing", "rlfarm.algos", "rlfarm.algos.base", "rlfarm.algos.ppo",
        "rlfarm.algos.appo", "rlfarm.algos.offpolicy", "rlfarm.algos.dqn", "rlfarm.algos.sac"]
FORBIDDEN_FOR_PURE = ["redis", "celery", "kombu", "rlfarm.store", "rlfarm.worker", "rlfarm.dispatch",
                      "rlfarm.checkpoint", "rlfarm.metrics", "rlfarm.cluster", "rlfarm.trainer",
                      "rlfarm.outage", "rlfarm.celery_app", "tensorboard", "tasks", "cli"]


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


def test_pure_modules_import_nothing_that_does_io():
    result = import_with_forbidden(PURE, FORBIDDEN_FOR_PURE)
    assert result["errors"] == dict.fromkeys(PURE), result["errors"]


def test_the_rule_check_itself_catches_a_forbidden_import():
    result = import_with_forbidden(["rlfarm.store"], ["redis"])  # the store talks to Redis
    assert "forbidden import: redis" in result["errors"]["rlfarm.store"]


def test_the_trainer_side_never_imports_the_worker():
    result = import_with_forbidden(["rlfarm.trainer", "rlfarm.dispatch", "rlfarm.api"], ["rlfarm.worker", "tasks"])
    assert result["errors"] == dict.fromkeys(["rlfarm.trainer", "rlfarm.dispatch", "rlfarm.api"]), result["errors"]


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
    """The registry answers which algorithm does what: no `algo == "..."` outside rlfarm/algos/."""
    offenders = []
    for path in [*sorted((ROOT / "rlfarm").glob("*.py")), ROOT / "cli.py", ROOT / "tasks" / "__init__.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
                sides = [node.left, *node.comparators]
                names = {ast.unparse(s) for s in sides}
                strings = {s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)}
                if strings & set(ALGORITHMS) and any("algo" in n for n in names):
                    offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders
