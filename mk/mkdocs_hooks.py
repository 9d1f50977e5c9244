"""MkDocs hooks of the documentation site (mkdocs.yml): pages the site has and docs/ does not.

* ``overview.md``: the repository's README.md, its links into docs/ made relative to docs/
  (``docs/findings.md`` -> ``findings.md``), and the pages' links to ``../README.md`` pointed at
  it, so that a page reads the same on a forge and on the site.
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

#: the site's page holding the repository's README.md
OVERVIEW = "overview.md"
#: the folder of the API reference pages (one per module, generated)
API = "api/"
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):"
                   r"<code>(~?)\.?([\w.]+)(\(\))?</code>")
_README_LINK = re.compile(r"\]\(((?:\.\./)+)README\.md(#[^)\s]*)?\)")


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
    files.append(File.generated(config, OVERVIEW, content=readme))
    for page, module in api_pages(config["nav"]).items():
        files.append(File.generated(config, page, content=f"::: {module}\n"))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == OVERVIEW or page.file.src_uri.startswith(API):
        return markdown
    depth = page.file.src_uri.count("/")  # a page of docs/notes/ reaches README.md by ../../

    def link(m):
        if len(m.group(1)) // 3 != depth + 1:
            return m.group(0)
        target = posixpath.relpath(OVERVIEW, posixpath.dirname(page.file.src_uri) or ".")
        return f"]({target}{m.group(2) or ''})"

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
