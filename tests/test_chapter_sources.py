"""Each chapter's jupytext source (notebooks/NN_*.py) and its committed executed .ipynb are one pair.

An edit made on one side only (in Jupyter without jupytext, or in the .py without re-executing) fails
here. Fix: ``jupytext --sync notebooks/NN_*.py`` and re-execute (CONTRIBUTING.md).
"""

from __future__ import annotations

import pytest

from course_lib.core.paths import repo_root
from course_lib.course import chapter_sources

jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")

SOURCES = sorted((repo_root() / "notebooks").glob("[0-9][0-9]_*.py"))


def _cells(nb):
    return [(cell.cell_type, cell.source.strip()) for cell in nb.cells]


def test_every_chapter_has_a_source_and_a_notebook():
    notebooks = sorted((repo_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert SOURCES, "no chapter sources notebooks/NN_*.py"
    assert [p.stem for p in SOURCES] == [p.stem for p in notebooks]
    assert chapter_sources() == SOURCES


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_source_and_notebook_are_in_sync(source):
    text = jupytext.read(source)
    executed = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    a, b = _cells(text), _cells(executed)
    for index, (left, right) in enumerate(zip(a, b)):
        assert left == right, f"{source.name}: cell {index} differs from the .ipynb (run jupytext --sync)"
    assert len(a) == len(b), f"{source.name}: {len(a)} cells in the source, {len(b)} in the .ipynb"
    assert executed.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent"
    # what JupyterLab writes on save (ipykernel's kernelspec): opening a chapter must not mark it modified
    assert executed.metadata["kernelspec"]["display_name"] == "Python 3 (ipykernel)"
    assert text.metadata["kernelspec"]["display_name"] == "Python 3 (ipykernel)"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_is_executed(source):
    executed = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    unexecuted = [i for i, cell in enumerate(code) if cell.execution_count is None]
    assert not unexecuted, f"{source.name}: code cells {unexecuted} were never executed (CONTRIBUTING.md)"
    errors = [out for cell in code for out in cell.outputs if out.get("output_type") == "error"]
    assert not errors, f"{source.name}: the committed run raised {errors[0].get('ename')}"


def test_badges_and_install_cells_name_the_one_repository():
    from course_lib.course import repository, repository_files, repository_links

    repo = repository()
    for path in repository_files():
        links = repository_links(path.read_text())
        assert links, f"{path.name} names no repository (no Colab badge or clone URL)"
        assert links == {repo}, f"{path.name} points at {sorted(links)}, pyproject.toml says {repo!r}"


def test_set_repository_rewrites_every_link(tmp_path):
    import shutil

    from course_lib.course import repository, repository_files, repository_links, set_repository

    (tmp_path / "notebooks").mkdir()
    for path in [repo_root() / "pyproject.toml", *repository_files()]:
        shutil.copy(path, tmp_path / path.relative_to(repo_root()))
    with pytest.raises(ValueError, match="url must look like"):
        set_repository("github.com/someone", tmp_path)
    changed = set_repository("https://github.com/someone/my-course.git", tmp_path)
    assert repository(tmp_path) == "someone/my-course"
    assert len(changed) == 1 + len(repository_files(tmp_path))
    for path in repository_files(tmp_path):
        assert repository_links(path.read_text()) == {"someone/my-course"}, path.name
