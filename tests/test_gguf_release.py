"""models.gguf: the loader releases each weight's file pages once it has its own copy (lower peak RSS)."""

import mmap
import sys
import warnings

import pytest
import torch

from course_lib.models import gguf

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps and madvise")


def test_file_pages_are_released_and_the_values_read_back(tmp_path):
    x = torch.arange(4 * mmap.PAGESIZE, dtype=torch.float32)
    (tmp_path / "w.bin").write_bytes(x.numpy().tobytes())
    with open(tmp_path / "w.bin", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only buffer: torch warns that it is not writable
            t = torch.frombuffer(m, dtype=torch.float32)
        mapped = gguf._file_mappings(tmp_path)
        assert any(lo <= t.data_ptr() < hi for lo, hi in mapped)
        gguf._release_file_pages(t, mapped)
        assert torch.equal(t, x)  # the pages fault in again from the file
        del t


def test_memory_outside_the_files_is_left_alone(tmp_path):
    heap = torch.arange(4 * mmap.PAGESIZE, dtype=torch.float32)
    gguf._release_file_pages(heap, gguf._file_mappings(tmp_path))  # no mapping of tmp_path: nothing happens
    gguf._release_file_pages(heap, [(heap.data_ptr() - 1, heap.data_ptr())])  # not inside a range either
    assert torch.equal(heap, torch.arange(4 * mmap.PAGESIZE, dtype=torch.float32))
