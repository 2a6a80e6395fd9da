"""core.memory.freeze_imports: the libraries leave the collector's walk, and later garbage is still collected."""

import subprocess
import sys

import pytest

from course_lib.core import memory

CHILD = r"""
import gc, weakref
from course_lib.core import memory

n = memory.freeze_imports(("json",))
assert n > 0 and gc.get_freeze_count() > 0

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after the freeze: the collector must still free it
alive = weakref.ref(a)
del a, b
gc.collect()
print(alive() is None, n)
"""


def test_freezing_keeps_later_cycles_collectable():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=True)
    freed, frozen = out.stdout.split()
    assert freed == "True" and int(frozen) > 1000


def test_a_full_collection_walks_only_what_came_after():
    child = (
        "import gc, time\n"
        "from course_lib.core import memory\n"
        "memory.freeze_imports()\n"
        "t = time.perf_counter(); gc.collect(); print(time.perf_counter() - t, len(gc.get_objects()))\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300, check=True)
    _, tracked = out.stdout.split()
    assert int(tracked) < 50_000  # torch and transformers' Llama modules: ~360k objects, all frozen


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="modules"):
        memory.freeze_imports("torch")
    with pytest.raises(ValueError, match="modules"):
        memory.freeze_imports([1])
