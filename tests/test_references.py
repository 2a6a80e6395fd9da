"""data/references.json: every external figure has a source, a URL and dates; the course cites it, not outside files."""

import json
import re
from urllib.parse import urlparse

import pytest

from course_lib.core.paths import data_dir, repo_root
from course_lib.measure import references

ALL = references.references()
WORKS = ("huyen", "nvidia_mastering_inference", "xiao_zhu")


def test_file_is_the_one_in_data_and_keys_are_unique():
    raw = json.loads((data_dir() / "references.json").read_text(encoding="utf-8"))["references"]
    keys = [entry["key"] for entry in raw]
    assert len(keys) == len(set(keys))
    assert list(ALL) == keys


@pytest.mark.parametrize("key", list(ALL))
def test_every_entry_is_complete(key):
    ref = ALL[key]
    for name in references.REQUIRED:
        assert str(getattr(ref, name)).strip(), (key, name)
    assert ref.kind in references.KINDS
    url = urlparse(ref.url)
    assert url.scheme == "https" and "." in url.netloc and " " not in ref.url, ref.url
    assert references.parse_date(ref.date) <= references.parse_date(ref.retrieved)
    if ref.kind == "figure":
        assert ref.quote.strip(), "a figure says in a few words what the course quotes"
        assert ref.value is None or ref.unit is not None
    if ref.value is not None:
        assert ref.value_text


def test_works_the_course_follows_are_there():
    assert ALL["huyen"].chapter.startswith("ch. 9") and "Inference Optimization" in ALL["huyen"].chapter
    assert "2501.09223" in ALL["xiao_zhu"].url
    assert ALL["nvidia_mastering_inference"].url == (
        "https://developer.nvidia.com/blog/mastering-llm-techniques-inference-optimization/"
    )
    assert ALL["nvidia_mastering_inference"].date == "2023-11-17"
    for key in WORKS:
        assert ALL[key].kind == "work"


def test_dates_parse_and_bad_dates_do_not():
    assert references.parse_date("2023-11").month == 11
    assert references.parse_date("2023-11-30").day == 30
    assert references.parse_date("2019").year == 2019
    for bad in ("Nov 2023", "2023-13", "2023/11/30", "", "23-11-30"):
        with pytest.raises(ValueError):
            references.parse_date(bad)


def test_every_gpu_in_the_datasheet_table_has_its_datasheet():
    gpus = json.loads((data_dir() / "gpu_specs.json").read_text(encoding="utf-8"))["gpus"]
    sheets = {ref.gpu: ref for ref in ALL.values() if ref.kind == "datasheet"}
    assert all(sheets.values()) and set(sheets) <= {g["name"] for g in gpus}
    for gpu in gpus:
        # the A100 40GB shares the A100 datasheet; every other row has its own entry
        ref = sheets.get(gpu["name"]) or sheets["A100 80GB SXM"]
        assert ref.url in gpu["source"], (gpu["name"], "its source names the datasheet's URL")


def test_gpu_specs_about_points_here():
    about = json.loads((data_dir() / "gpu_specs.json").read_text(encoding="utf-8"))["_about"]
    assert "references.json" in about


def test_gpt_fast_mbu_is_reconciled_with_the_datasheet_bandwidth():
    """72% (blog: 107 tok/s over 2.0 TB/s) vs 69% (104.9 tok/s over the 2.039 TB/s datasheet): the note says so."""
    mbu = references.reference("gpt_fast_mbu_llama2_7b")
    tok_s = references.reference("gpt_fast_llama2_7b_fp16_tok_s").value
    assert mbu.value == 0.72 and tok_s == 104.9
    for text in ("107", "2.0 TB/s", "2.039", "69.3%", "72.1%", "104.9"):
        assert text in mbu.note, text
    gpus = json.loads((data_dir() / "gpu_specs.json").read_text(encoding="utf-8"))["gpus"]
    a100 = next(g for g in gpus if g["name"] == "A100 80GB SXM")
    params = 6.738e9  # Llama-2-7B, embeddings included (course_lib.models.accounting)
    assert params * 2 * tok_s / (a100["hbm_tbps"] * 1e12) == pytest.approx(0.693, abs=0.001)
    assert params * 2 * 107 / 2.0e12 == pytest.approx(0.721, abs=0.001)


def test_unknown_key_names_the_close_ones():
    with pytest.raises(references.UnknownReference) as err:
        references.reference("gpt_fast_mbu")
    message = str(err.value)
    assert "gpt_fast_mbu_llama2_7b" in message and "data/references.json" in message
    assert isinstance(err.value, KeyError)
    with pytest.raises(KeyError):
        references.cite("no_such_thing_at_all")


def test_cite_a_figure():
    text = references.cite("gpt_fast_mbu_llama2_7b")
    assert text.startswith("gpt-fast (PyTorch blog), 30 Nov 2023: 72% MBU")
    assert "(https://pytorch.org/blog/accelerating-generative-ai-2/)" in text
    assert "not re-checked" not in text
    assert "https://" not in references.cite("gpt_fast_mbu_llama2_7b", link=False)


def test_cite_second_hand_and_unchecked_figures_says_so():
    anyscale = references.cite("anyscale_input_output_ratio", link=False)
    assert "100 input tokens" in anyscale and "via Huyen" in anyscale and "Nov 2023" in anyscale
    assert "not re-checked" in references.cite("orca_throughput")


def test_cite_a_work_and_a_datasheet():
    assert references.cite("huyen", link=False) == (
        "Chip Huyen, *AI Engineering: Building Applications with Foundation Models* (O'Reilly, 2025), "
        'ch. 9, "Inference Optimization"'
    )
    assert "arxiv.org/abs/2501.09223" in references.cite("xiao_zhu")
    assert references.cite("nvidia_mastering_inference", link=False).endswith("NVIDIA Technical Blog (17 Nov 2023)")
    sheet = references.cite("datasheet_a100", link=False)
    assert "NVIDIA A100" in sheet and "gpu_specs.json" in sheet and "Jun 2021" in sheet


def test_value_text():
    assert references.format_value(0.72, "fraction") == "72%"
    assert references.format_value([2, 4], "x") == "2–4×"
    assert references.format_value([0.6, 0.8], "fraction") == "60–80%"
    assert references.format_value(104.9, "tok/s") == "104.9 tok/s"
    assert references.format_value({"a": 1.5}, "x") == "a: 1.5×"
    assert references.format_value(None) == ""


def test_malformed_entries_are_refused(tmp_path):
    good = {
        "key": "k",
        "kind": "figure",
        "what": "w",
        "source": "s",
        "short": "s",
        "url": "https://example.org/",
        "date": "2023",
        "retrieved": "2026-11-30",
    }
    cases = {
        "lacks url": {**good, "url": ""},
        "bad date": {**good, "date": "November 2023"},
        "unknown field": {**good, "colour": "red"},
        "bad kind": {**good, "kind": "rumour"},
        "bad value": {**good, "value": "fast"},
        "bad via": {**good, "via": "nobody"},
    }
    for i, (why, entry) in enumerate(cases.items()):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps({"references": [entry]}))
        with pytest.raises(ValueError):
            references.references(path)
        assert why
    path = tmp_path / "dup.json"
    path.write_text(json.dumps({"references": [good, good]}))
    with pytest.raises(ValueError, match="twice"):
        references.references(path)


# Files a learner has, that must not send them to files they do not have. A match may span lines:
# "as seed\n# 000" in a chapter source, "as seed\\n",\n "000" in its .ipynb.
_OUTSIDE = re.compile(
    r"ANCHORS"
    r"|/work/shared"
    r"|\bseeds?(?:[\s#\",]|\\n)*(?:\d{3}|S\d)\b"  # "seed 000", "seed S0"
    r"|\bthe seed's\b|\bas seed\b|\(seeds\b",  # prose about the seed documents, not seed= arguments
    re.IGNORECASE,
)


def _course_files():
    root = repo_root()
    files = [*root.glob("notebooks/*.py"), *root.glob("notebooks/*.ipynb"), *root.glob("course_lib/**/*.py")]
    for path in (root / "data").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md", ".txt", ".py", ".toml", ".yaml", ".yml", ".csv"):
            if path.stat().st_size < 5_000_000:
                files.append(path)
    return sorted(files)


def test_no_reference_to_files_outside_the_repo():
    """A learner has only the repository: no 'ANCHORS.md', no 'seed 00N' — cite data/references.json instead."""
    root = repo_root()
    hits = []
    for path in _course_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in _OUTSIDE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            hits.append(f"{path.relative_to(root)}:{line}: {match.group(0)!r}")
    assert not hits, "cite course_lib.measure.references instead of files outside the repository:\n" + "\n".join(hits)
