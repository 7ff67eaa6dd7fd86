"""MkDocs hook: render every ``docs/tutorials/*.py`` (jupytext percent format) as a page.

Markdown cells become page text and code cells become Python code blocks, so the site shows
exactly the script that the test suite runs. The figures the text embeds are the PNGs under
``docs/tutorials/figures/``, written by running the script in full from ``docs/tutorials/``.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
from mkdocs.structure.files import File, Files


def tutorial_markdown(script: Path) -> str:
    """The page Markdown of one tutorial script (parsed with jupytext, not by hand)."""
    notebook = jupytext.reads(script.read_text(encoding="utf-8"), fmt="py:percent")
    parts = []
    for cell in notebook.cells:
        source = cell.source.strip("\n")
        if not source:
            continue
        if cell.cell_type == "markdown":
            parts.append(source)
        else:
            parts.append(f"```python\n{source}\n```")
    parts.append(
        f"*This page is generated from [`docs/tutorials/{script.name}`]({script.name}); "
        f"run it with `python {script.name}` (set `BO_ONLINE_TUTORIAL_SMALL=1` for a quick run).*"
    )
    return "\n\n".join(parts) + "\n"


def on_files(files: Files, config) -> Files:  # noqa: ANN001 (MkDocs config object)
    docs_dir = Path(config["docs_dir"])
    for script in sorted((docs_dir / "tutorials").glob("*.py")):
        src_uri = f"tutorials/{script.stem}.md"
        files.append(File.generated(config, src_uri, content=tutorial_markdown(script)))
    return files
