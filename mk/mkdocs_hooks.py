"""MkDocs hooks of the documentation site (mkdocs.yml): pages the site has and docs/ does not.

* ``index.md``, the page the site opens on: the overview, the repository's README.md, its links
  into docs/ made relative to docs/ (``docs/findings.md`` -> ``findings.md``), and the pages'
  links to ``../README.md`` pointed at it, so that a page reads the same on a forge and on the
  site. docs/README.md, the forge's list of the pages, is left out of the site (the nav lists
  them); the pages' links to it point at the overview's list, its section "Documentation".
* In every page's tables, a pipe escaped inside code (``--answers all\\|last``, as GitHub's
  tables need it) is written bare: Python-Markdown's tables keep a code span's pipes in their
  cell, and would print the backslash.
* ``api/<name>.md``: for every page ``api/<name>.md`` the nav names, the API reference of the
  module ``attnquery.<name>``, rendered by mkdocstrings from its numpydoc docstrings. The
  docstrings' Sphinx roles (``:class:`~attnquery.oracles.ValueOracle```) become links to the
  object's entry where the reference has one (mkdocs-autorefs), its name in code otherwise.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

#: the site's page holding the repository's README.md: the page the site opens on
OVERVIEW = "index.md"
#: docs/README.md (a forge's index of docs/): not a page of the site, its links go here
PAGE_LIST = "README.md"
#: the folder of the API reference pages (one per module, generated)
API = "api/"
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):"
                   r"<code>(~?)\.?([\w.]+)(\(\))?</code>")
_README_LINK = re.compile(r"\]\(((?:\.\./)*)README\.md(#[^)\s]*)?\)")
_CODE = re.compile(r"`[^`\n]*`")


def _nav_pages(nav) -> list[str]:
    """Every page path the nav of mkdocs.yml names."""
    out = []
    for item in nav or []:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def api_pages(nav) -> dict[str, str]:
    """``{page: module}`` of the API reference pages the nav names."""
    return {p: "attnquery." + p[len(API):-len(".md")] for p in _nav_pages(nav)
            if p.startswith(API) and p.endswith(".md")}


def on_files(files, config):
    root = Path(config["config_file_path"]).parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    docs = Path(config["docs_dir"]).name + "/"
    readme = re.sub(r"(\]\()" + re.escape(docs), r"\1", readme)
    page_list = files.get_file_from_path(PAGE_LIST)
    if page_list is not None:
        files.remove(page_list)
    files.append(File.generated(config, OVERVIEW, content=readme))
    for page, module in api_pages(config["nav"]).items():
        files.append(File.generated(config, page, content=f"::: {module}\n"))
    return files


def _bare_pipes_in_table_code(markdown: str) -> str:
    """``\\|`` inside a code span of a table row written ``|`` (see the module's docstring)."""
    return "\n".join(_CODE.sub(lambda m: m.group(0).replace("\\|", "|"), line)
                     if line.lstrip().startswith("|") else line
                     for line in markdown.split("\n"))


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith(API):
        return markdown
    markdown = _bare_pipes_in_table_code(markdown)
    if page.file.src_uri == OVERVIEW:
        return markdown
    depth = page.file.src_uri.count("/")  # a page of docs/notes/ reaches README.md by ../../
    here = posixpath.dirname(page.file.src_uri) or "."

    def link(m):
        up = len(m.group(1)) // 3
        if up == depth + 1:  # the repository's README.md: the overview
            return f"]({posixpath.relpath(OVERVIEW, here)}{m.group(2) or ''})"
        if up == depth:  # docs/README.md: the overview's list of the pages
            return f"]({posixpath.relpath(OVERVIEW, here)}#documentation)"
        return m.group(0)

    return _README_LINK.sub(link, markdown)


def on_page_content(html, page, config, files):
    if not page.file.src_uri.startswith(API):
        return html
    module = "attnquery." + page.file.src_uri[len(API):-len(".md")]

    def role(m):
        short, name, call = m.group(1), m.group(2), m.group(3) or ""
        identifier = name if name.startswith("attnquery") else f"{module}.{name}"
        shown = name.rpartition(".")[2] if short else name
        return f'<autoref identifier="{identifier}" optional><code>{shown}{call}</code></autoref>'

    return _ROLE.sub(role, html)
