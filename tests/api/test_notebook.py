"""``notebooks/quickstart.ipynb`` runs top to bottom (with nbclient), so it never rots.

It is run from both places a reader would start Jupyter: the repository root and
``notebooks/``. The notebook asserts its own results (decode round trip, identical ids
in the benchmark); here we also check that its key outputs are there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO_ROOT / "notebooks" / "quickstart.ipynb"


def run_notebook(cwd: Path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return notebook


def outputs_of(notebook) -> tuple[str, set[str]]:
    """All text the cells printed or returned, and the MIME types they displayed."""
    texts, mime_types = [], set()
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts.append(output.get("text", ""))
            data = output.get("data", {})
            mime_types |= set(data)
            texts.append(data.get("text/html", "") + data.get("text/plain", ""))
    return "\n".join(texts), mime_types


def test_notebook_is_clean():
    """Stored without outputs, so diffs stay small and the text cannot go stale."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")


@pytest.mark.parametrize("cwd", [REPO_ROOT, REPO_ROOT / "notebooks"], ids=["repo root", "notebooks dir"])
def test_notebook_runs(cwd):
    text, mime_types = outputs_of(run_notebook(cwd))
    assert "Tokenizer(name='kimi_k3'" in text
    assert "<|open|> control tokens in the chat: with segments 5 | as one allow_special string 6" in text
    assert 'title="id 163587"' in text  # token boundaries drawn as HTML spans
    assert {"text/html", "image/png"} <= mime_types  # the spans and the benchmark plot
    assert "1,000,000 chars: kimi_tok" in text
