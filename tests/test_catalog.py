"""course_lib.models.catalog: the table of the course's models, read from file headers and cards."""

import pytest

from course_lib.models import catalog as cat
from course_lib.models.load import EMBEDDED, INSTALLED, load_model


def test_every_model_is_listed_with_a_role():
    rows = cat.catalog()
    assert [r.name for r in rows] == [*EMBEDDED, *INSTALLED]
    assert all(r.role for r in rows), [r.name for r in rows if not r.role]
    assert all(r.fp32_bytes == 4 * r.params > 0 for r in rows)


def test_parameter_count_from_the_header_equals_the_loaded_model():
    model, _ = load_model("tiny-target")
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}  # a tied embedding counts once
    row = next(r for r in cat.catalog() if r.name == "tiny-target")
    assert row.params == sum(unique.values())


def test_cache_ratio():
    row = cat.ModelEntry("m", "embedded", 10, 40, True, True, "x")
    assert row.cache_ratio(20) == pytest.approx(2.0)
    assert row.cache_ratio(None) is None and row.cache_ratio(0) is None


def test_print_catalog_names_the_cache(capsys):
    cat.print_catalog(32 * 2**20)
    out = capsys.readouterr().out
    assert "32 MiB" in out and "tiny-target" in out
    cat.print_catalog(None)
    assert "unknown" in capsys.readouterr().out
