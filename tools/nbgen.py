"""Shared pieces of the notebook generators (``tools/make_nb_*.py``): cells, badge, install cell.

The committed artifact is the executed ``.ipynb``; these scripts only write its source cells.
Regenerate and execute with, e.g.::

    python tools/make_nb_00.py
    COURSE_MODE=quick MPLBACKEND=Agg jupyter nbconvert --to notebook --execute --inplace \
        notebooks/00_setup_and_hardware.ipynb
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = "llm-inference-course/course"
ROOT = Path(__file__).resolve().parents[1]


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str, marker: str | None = None):
    """A code cell; ``marker`` is 'check' (deterministic output, compared by nbval) or 'ignore' (timings)."""
    body = textwrap.dedent(text).strip("\n")
    if marker == "check":
        body = "# NBVAL_CHECK_OUTPUT\n" + body
    elif marker == "ignore":
        body = "# NBVAL_IGNORE_OUTPUT\n" + body
    elif marker is not None:
        raise ValueError(f"marker must be 'check', 'ignore' or None, got {marker!r}")
    return new_code_cell(body)


def badge(name: str):
    url = f"https://colab.research.google.com/github/{REPO}/blob/main/notebooks/{name}.ipynb"
    return md(f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})")


def install_cell():
    return code(f'''
        # Colab only: fetch the course and install course_lib WITHOUT replacing Colab's own torch/triton.
        import os
        import subprocess
        import sys

        if "google.colab" in sys.modules:
            if not os.path.isdir("/content/course"):
                subprocess.run(["git", "clone", "--depth", "1", "https://github.com/{REPO}",
                                "/content/course"], check=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "/content/course"], check=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "transformers>=4.56", "tokenizers>=0.20",
                            "safetensors>=0.4", "psutil>=5.9"], check=True)
            os.environ["COURSE_ROOT"] = "/content/course"
        ''')


def write(cells, name: str) -> Path:
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    path = ROOT / "notebooks" / f"{name}.ipynb"
    path.parent.mkdir(exist_ok=True)
    nbformat.write(nb, path)
    print(f"wrote {path}")
    return path
