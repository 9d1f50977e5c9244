"""The documentation a reader browses on a forge: README.md and the pages of docs/.

Every relative link resolves to a file of the repository and every anchor to a heading of its
page (GitHub's heading slugs); the README stays short and keeps its sections in the order a
newcomer reads them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from attnquery.study.findings import README_BEGIN, README_END, render_template

from .fresh import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
         *sorted((REPO / "docs" / "notes").glob("*.md"))]
#: the README's length a newcomer reads (the issue asks for at most about 250 lines)
README_MAX_LINES = 250
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code."""
    text = re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lowercased, punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of the headings of the Markdown page ``path`` (duplicates numbered)."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^(```|~~~).*?^\1\s*$", "", path.read_text(encoding="utf-8"),
                  flags=re.M | re.S)
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """Relative links and anchors of ``page`` that do not resolve."""
    problems = []
    for m in _LINK.finditer(_prose(page.read_text(encoding="utf-8"))):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{page.relative_to(root)}: {target}: no such file")
            continue
        if root.resolve() not in (dest, *dest.parents):
            problems.append(f"{page.relative_to(root)}: {target}: outside the repository")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{page.relative_to(root)}: {target}: no heading with this anchor")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_the_link_check_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Page A\n\n## The `fit_bias` option, in full\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#the-fit_bias-option-in-full) [ok](#top-title)\n"
        "[bad file](docs/b.md) [bad anchor](docs/a.md#nothing) [web](https://x.org/#y)\n"
        "`[not a link](nowhere.md)`\n\n```\n[not a link](nowhere.md)\n```\n# Top title\n")
    problems = broken_links(page, tmp_path)
    assert len(problems) == 2, problems
    assert "docs/b.md: no such file" in problems[0]
    assert "docs/a.md#nothing: no heading" in problems[1]


def test_the_readme_is_short_and_in_the_order_a_newcomer_reads():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    sections = re.findall(r"^## (.*)$", text, re.M)
    order = ["Quick start", "Direct use", "What the study finds", "Library",
             "Extract the parameters of your own black box", "Running on a cluster",
             "Reproducibility", "Citing figures, tables and numbers", "Documentation"]
    assert [s for s in sections if s in order] == order, sections
    # the one figure it shows is a PNG of the repository
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images and all(i.endswith(".png") and (REPO / i).is_file() for i in images), images
    # every page of docs/ is reachable from the README or the docs index
    linked = set(re.findall(r"\(docs/([\w.-]+\.md)", text)) | set(
        re.findall(r"\(([\w.-]+\.md)", (REPO / "docs" / "README.md").read_text()))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert pages <= linked, f"pages no index links to: {sorted(pages - linked)}"


def test_the_readme_holds_the_generated_table_and_the_committed_numbers_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.count(README_BEGIN) == 1 and readme.count(README_END) == 1
    committed = json.loads((REPO / "docs" / "numbers.json").read_text())["numbers"]
    table = readme.split(README_BEGIN)[1].split(README_END)[0]
    template = (REPO / "docs" / "templates" / "readme_table.md").read_text(encoding="utf-8")
    machine = json.loads((REPO / "docs" / "numbers.json").read_text()).get("machine")
    rendered, missing = render_template(template, committed, machine)
    assert not missing, f"the committed numbers lack {missing}"
    assert table.strip() == rendered.strip(), "README's findings table is not the rendered " \
        "template: run `make findings`"
    page = (REPO / "docs" / "findings.md").read_text(encoding="utf-8")
    rendered, missing = render_template(
        (REPO / "docs" / "templates" / "findings.md").read_text(encoding="utf-8"), committed,
        machine)
    assert not missing, f"the committed numbers lack {missing}"
    assert page == rendered, "docs/findings.md is not the rendered template: run `make findings`"


def test_the_documentation_site_builds_strict(tmp_path):
    """``make docs``: mkdocs.yml builds the pages, the API reference and the notes with
    ``--strict``, offline; any warning (a broken link or anchor, a docstring mkdocstrings cannot
    read) fails the build, and this test names them."""
    import os
    import subprocess
    import sys

    mkdocs = Path(sys.executable).with_name("mkdocs")
    assert mkdocs.is_file(), f"{mkdocs} is missing: install the test extra ('.[test]')"
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    log = proc.stdout + proc.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert proc.returncode == 0 and not warnings, "\n".join(warnings) or log[-3000:]
    site = tmp_path / "site"
    # every page of the nav was written, the API reference rendered from the docstrings
    learners = (site / "api" / "learners.html").read_text(encoding="utf-8")
    from attnquery.learners import __all__ as exported

    for name in exported:
        assert f'id="attnquery.learners.{name}"' in learners, name
    # a class's entry shows its constructor's signature
    assert 'ExactValueQueryLearner</span><span class="p">(' in learners
    # the plug-in contract and the route learners the pages name have entries of their own
    base = (site / "api" / "learners.base.html").read_text(encoding="utf-8")
    from attnquery.learners.base import __all__ as contract

    for name in contract:  # every name the plug-in contract exports
        assert f'id="attnquery.learners.base.{name}"' in base, name
    for module, name in [("vector.served", "ServedVectorLearner"),
                         ("vector.rotary", "RotaryVectorLearner"),
                         ("vector.rotary_layer", "RotaryLayerVectorLearner")]:
        page = (site / "api" / f"learners.{module}.html").read_text(encoding="utf-8")
        assert f'id="attnquery.learners.{module}.{name}"' in page, name
    # the site opens on the overview (the README), its tables' code without escapes
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "What the study finds" in index and "all\\|last" not in index
    assert "all|last" in index and (site / "findings.html").is_file()


def _table_rows(page: str, header: str) -> dict[str, str]:
    """``{first cell's code: the rest of the row}`` of the Markdown table whose header row starts
    with ``header`` on ``docs/<page>``."""
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    block = text.split(header, 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in block.splitlines()[2:]:
        first, _, rest = line.strip("|").partition("|")
        m = re.match(r"\s*`(?:learners\.)?(\w+)", first)
        assert m, f"docs/{page}: a row without a learner: {line}"
        rows[m.group(1)] = rest
    return rows


def test_the_library_table_lists_every_exported_learner():
    from attnquery.learners import __all__ as exported

    rows = _table_rows("library.md", "| class | what it does |")
    missing = sorted(set(exported) - set(rows))
    assert not missing, f"docs/library.md's table lacks the learners {missing}"


def _stages_used() -> dict[str, set[str]]:
    """``{module path: stage names}``: the names the learners' sources give a stage (``*STAGES``
    tuples and ``.stage("name")`` blocks)."""
    import ast

    out = {}
    for path in sorted((REPO / "src" / "attnquery" / "learners").rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple)
                    and any(isinstance(t, ast.Name) and t.id.endswith("STAGES")
                            for t in node.targets)):
                names |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "stage" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
        out[str(path.relative_to(REPO))] = names
    return out


def test_the_stage_table_lists_every_learner_and_every_stage():
    import inspect

    import attnquery.learners as learners

    rows = _table_rows("learner-core.md", "| learner | stages |")
    assert set(learners.__all__) <= set(rows), sorted(set(learners.__all__) - set(rows))
    listed = {name: set(re.findall(r"`(\w+)`", rest)) for name, rest in rows.items()}
    everywhere = set().union(*listed.values())
    used = _stages_used()
    assert sum(map(len, used.values())) > 20, used  # the scan finds the stages
    for path, names in used.items():
        assert names <= everywhere, f"{path}: stages {sorted(names - everywhere)} are not in " \
            "docs/learner-core.md's stage table"
    # each learner's row names every stage of its module's STAGES
    for name in learners.__all__:
        module = inspect.getmodule(getattr(learners, name))
        stages = set(getattr(module, "STAGES", ()))
        assert stages <= listed[name], f"{name}: {sorted(stages - listed[name])} missing"


def test_every_public_module_has_an_api_reference_page():
    """mkdocs.yml's "API reference" names one page per module of attnquery (mk/mkdocs_hooks.py
    renders each from its docstrings): a new module cannot be left out of the reference."""
    import pkgutil

    import yaml

    import attnquery
    import attnquery.study as study

    class _Loader(yaml.SafeLoader):  # mkdocs.yml may hold !!python tags; the nav has none
        pass

    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)
    nav = yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)["nav"]
    api = next(item["API reference"] for item in nav
               if isinstance(item, dict) and "API reference" in item)
    pages = {title: page for entry in api for title, page in entry.items()}
    modules = {f"attnquery.{m.name}" for m in pkgutil.iter_modules(attnquery.__path__)
               if not m.name.startswith("_")}
    # every module of the study package (which was modules of attnquery itself)
    modules |= {f"attnquery.study.{m.name}" for m in pkgutil.iter_modules(study.__path__)
                if not m.name.startswith("_")}
    # and a page of their own for the plug-in contract, the route learners the pages name, the
    # vector-output layers and the rotary checkpoints
    modules |= {"attnquery.learners.base", "attnquery.learners.vector.served",
                "attnquery.learners.vector.rotary", "attnquery.learners.vector.rotary_layer",
                "attnquery.models.vector", "attnquery.realheads.rotary"}
    assert set(pages) == modules, (sorted(modules - set(pages)), sorted(set(pages) - modules))
    assert all(page == f"api/{t.removeprefix('attnquery.')}.md" for t, page in pages.items())


def test_the_registry_table_in_library_md_is_the_registry():
    """docs/library.md's table of every learner is learner_table()'s output (regenerate it
    by pasting `python -c "from attnquery.learners import learner_table as t; print(t())"`)."""
    from attnquery.learners import learner_table

    text = (REPO / "docs" / "library.md").read_text(encoding="utf-8")
    begin, end = ("<!-- registry table: learner_table() of attnquery.learners -->\n",
                  "\n<!-- end of the registry table -->")
    assert begin in text and end in text
    table = text.split(begin, 1)[1].split(end, 1)[0]
    builtin = "\n".join(line for line in learner_table().splitlines()
                        if "(plug-in " not in line)
    assert table == builtin


def test_user_pages_do_not_link_the_measurement_logs():
    """The user guide says how and what, with numbers from results; the dated measurement logs
    (docs/notes/) are linked from the contributor guide only."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)
    nav = yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)["nav"]
    user = next(item["User guide"] for item in nav
                if isinstance(item, dict) and "User guide" in item)
    pages = [p if isinstance(p, str) else next(iter(p.values())) for p in user]
    linking = [p for p in pages if "notes/" in (REPO / "docs" / p).read_text(encoding="utf-8")]
    assert pages and not linking, linking
