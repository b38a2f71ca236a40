"""The documentation: README.md leads (at most 300 lines, every relative link in it resolves), and the
reference site in docs/ (mkdocs.yml, MkDocs Material) builds with --strict, so a link to a page or a
heading that is not there fails here rather than on a reader."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from .conftest import ROOT

README = ROOT / "README.md"
README_MAX_LINES = 300


def markdown_text(path: Path) -> str:
    """The file's text without fenced code blocks and inline code, where `[x](y)` is not a link."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def relative_links(path: Path) -> list[str]:
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", markdown_text(path))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto:


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (MkDocs) gives a heading; GitHub's agrees for the
    plain headings these pages have."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*#*$", markdown_text(path), flags=re.M)
    return {slug(h) for h in headings}


def test_the_readme_leads_in_at_most_300_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, over {README_MAX_LINES}: move reference text to a page in docs/"
    )


def test_every_relative_link_in_the_readme_points_to_a_file_that_exists():
    links = relative_links(README)
    assert any(link.startswith("docs/") for link in links)  # the parser finds the README's links
    broken = []
    for link in links:
        target, _, anchor = link.partition("#")
        path = README if not target else ROOT / target
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: no heading with that anchor in {path.relative_to(ROOT)}")
    assert not broken, broken


def test_the_readme_shows_its_images_from_the_repository_root():
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", markdown_text(README))
    assert images and all((ROOT / image).is_file() for image in images), images


@pytest.mark.process  # runs mkdocs in a subprocess
def test_the_docs_site_builds_with_strict(tmp_path):
    """`mkdocs build --strict`: every page is in the nav, every link to a page, a heading or an image
    resolves, and nothing else warns (mkdocs-material is in the `test` and `docs` extras)."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    site = tmp_path / "site"
    for page in ("index", "cli", "reliability", "security", "metrics", "architecture", "pong"):
        assert (site / ("index.html" if page == "index" else f"{page}/index.html")).is_file(), page
    for image in ("flower-tasks.png", "plot-cartpole-ppo.png", "pong-curve.png"):
        assert (site / image).is_file(), image


def test_every_page_in_docs_is_in_the_nav():
    """A page left out of mkdocs.yml's nav is built but unreachable from the site's menu."""
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and all(re.search(rf":\s*{re.escape(page)}\s*$", nav, flags=re.M) for page in pages), pages


def readme_test_command() -> str:
    """The README's second command: the line of its first bash block that runs pytest."""
    block = re.search(r"```bash\n(.*?)```", README.read_text(), flags=re.S).group(1)
    return next(line for line in block.splitlines() if "pytest" in line and not line.startswith("#"))


def steps(command: str) -> list[str]:
    """The steps of an `a && b && c` command, with what only quiets apt taken out (.ci/run's
    DEBIAN_FRONTEND, -qq and >/dev/null) and sudo however it is spelled."""
    command = re.sub(
        r"\$\(command -v sudo\) |\$sudo |env DEBIAN_FRONTEND=noninteractive |-qq |>/dev/null",
        "",
        command.replace("\\\n", " "),
    )
    return [" ".join(step.split()) for step in command.split("&&")]


def test_ci_runs_exactly_the_readmes_test_command():
    """.ci/run is what CI runs: the README's test command, step for step, so the command a reader
    types is the one that passed."""
    script = (ROOT / ".ci" / "run").read_text()
    ci_command = script[script.index("apt-get update") - len("$sudo env DEBIAN_FRONTEND=noninteractive ") :]
    assert steps(ci_command.strip()) == steps(readme_test_command())


def test_the_readmes_test_command_needs_no_sudo_as_root():
    """Root in a container has no sudo: the command must not name it bare (`sudo: command not found`)."""
    assert not re.search(r"(^|&& |; )sudo ", readme_test_command())


def _parts_table() -> dict[str, set[str]]:
    """docs/architecture.md's parts table: {package: the module files it names} (`<name>/` stands for
    the algorithms' packages)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## 2. Parts", 1)[1].split("```", 2)[1]
    parts: dict[str, set[str]] = {}
    package = sub = None
    for line in block.splitlines():
        head = re.match(r"^  (\w+)/\s", line)
        if head:
            package, sub = head.group(1), None
            parts.setdefault(package, set())
        elif not line.startswith("    "):  # back at the top (tasks/, cli.py)
            package = sub = None
        if package is None:
            continue
        indent = len(line) - len(line.lstrip())
        nested = re.match(r"^ {19}(\w+)/\s", line)  # a subpackage's row; its files are indented further
        if nested:
            sub = nested.group(1)
            parts.setdefault(f"{package}/{sub}", set())
            continue
        if sub is not None and indent < 21:
            sub = None
        parts[f"{package}/{sub}" if sub else package] |= set(re.findall(r"\w+\.py|<name>/", line))
    return parts


def test_the_architecture_parts_table_is_the_tree():
    """Every module under rlfarm/ is named in its package's rows of the parts table, and every module
    named there exists (issue 34: the table had fallen behind the tree)."""
    parts = _parts_table()
    tree: dict[str, set[str]] = {}
    for path in (ROOT / "rlfarm").glob("*/*.py"):
        if path.name != "__init__.py":  # a package's __init__.py may be named, need not be
            tree.setdefault(path.parent.name, set()).add(path.name)
    for path in (ROOT / "rlfarm" / "algos").glob("*/"):
        if (path / "__init__.py").exists():
            tree.setdefault("algos", set()).add("<name>/")
    for path in (ROOT / "rlfarm").glob("*/*/*.py"):  # subpackages (farm/policies/), but the algorithms'
        if path.parent.parent.name != "algos" and path.name != "__init__.py":
            tree.setdefault(f"{path.parent.parent.name}/{path.parent.name}", set()).add(path.name)
    named = {package: {m for m in modules if m.endswith(".py") or m == "<name>/"} for package, modules in parts.items()}
    missing = {p: sorted(tree[p] - named.get(p, set())) for p in tree if tree[p] - named.get(p, set())}
    inits = {p: {"__init__.py"} if (ROOT / "rlfarm" / p / "__init__.py").exists() else set() for p in named}
    inits.update({p: set() for p in named if "/" in p and p not in inits})
    # the <name>/ row names the files of an algorithm's package too
    inits["algos"] = inits.get("algos", set()) | {path.name for path in (ROOT / "rlfarm" / "algos").glob("*/*.py")}
    stale = {
        p: sorted(named[p] - tree.get(p, set()) - inits[p]) for p in named if named[p] - tree.get(p, set()) - inits[p]
    }
    assert not missing, f"modules missing from docs/architecture.md's parts table: {missing}"
    assert not stale, f"modules named in the parts table that do not exist: {stale}"


def test_the_readme_says_how_rlfarm_gets_on_the_path_before_its_first_bare_command():
    """`rlfarm: command not found` for every command of the daily workflow: nothing said to activate
    the venv (issue 51)."""
    readme = (ROOT / "README.md").read_text()
    lines, fenced, in_code = readme.splitlines(), False, []
    for line in lines:  # whether each line is inside a fenced code block
        fenced ^= line.startswith("```")
        in_code.append(fenced)
    first_bare = next(i for i, line in enumerate(lines) if in_code[i] and line.startswith("rlfarm "))
    before = "\n".join(lines[:first_bare])
    assert "source .venv/bin/activate" in before and ".venv/bin/rlfarm" in before
    assert '.venv/bin/pip install -q -e ".[test]" && .venv/bin/python -m pytest -m unit' in readme


def test_the_readme_fits_100_columns_but_for_the_commands_typed_whole():
    """50 lines over 100 characters made the README hard to read in a terminal (issue 51); the
    install commands stay whole, as they are typed."""
    typed = ("python3.11 -m venv", "$(command -v sudo) apt-get")
    long = [
        (i, line[:60])
        for i, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
        if len(line) > 100 and not line.startswith(typed)
    ]
    assert not long, long
