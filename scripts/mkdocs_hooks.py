"""MkDocs hooks for the documentation site (``hooks:`` in mkdocs.yml).

* Links from a page into the repository (``[seccomp.py](../agentnest/runtime/docker/seccomp.py)``)
  are useful on a forge but are not pages: they become the path in code font.  A link
  whose file does not exist is left alone, so ``mkdocs build --strict`` still fails on it.
* Docstrings use Sphinx roles (``:class:`Sandbox```) and ``.. versionadded::``
  directives; the rendered API reference shows them as plain code and a note.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_REPO_LINK = re.compile(r"\[([^\]]+)\]\(((?:\.\./)+)([^)#\s]+)\)")
_ROLE = re.compile(r":(?:class|meth|func|attr|exc|mod|data|obj|const|py:\w+):(?=<code>)")
_VERSION = re.compile(r"\.\. version(added|changed)::\s*([\w.]+)")
_LITERAL = re.compile(r"(?<=[^:\s])::</p>")  # reST "Example::" before a code block reads "Example:"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(os.path.normpath(config["docs_dir"]))
    root = Path(os.path.normpath(os.path.dirname(config["config_file_path"])))
    page_dir = (docs / page.file.src_path).parent

    def repo_path(match: re.Match[str]) -> str:
        target = Path(os.path.normpath(page_dir / (match.group(2) + match.group(3))))
        if docs in target.parents or root not in target.parents or not target.exists():
            return match.group(0)  # a page, outside the repository, or broken: mkdocs judges it
        text, path = match.group(1), target.relative_to(root).as_posix()
        return f"`{path}`" if path.endswith(text.strip("`")) else f"{text} (`{path}`)"

    return _REPO_LINK.sub(repo_path, markdown)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    html = _ROLE.sub("", html)
    html = _LITERAL.sub(":</p>", html)

    def note(match: re.Match[str]) -> str:
        what = "Added" if match.group(1) == "added" else "Changed"
        return f"<em>{what} in version {match.group(2)}.</em>"

    return _VERSION.sub(note, html)
