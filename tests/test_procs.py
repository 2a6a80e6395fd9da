"""core.procs: workers fork from a server that imported torch once, and still see the parent's environment."""

import os

import pytest

from course_lib.core import procs


def _report(conn, key):
    conn.send((os.getppid(), os.environ.get(key), "torch" in __import__("sys").modules))
    conn.close()


def _child_view(key):
    ctx = procs.context()
    parent, child = ctx.Pipe(duplex=False)
    p = procs.process(ctx, _report, (child, key), daemon=True)
    p.start()
    child.close()
    assert parent.poll(60), "the child did not report"
    out = parent.recv()
    p.join(10)
    assert p.exitcode == 0
    return out


def test_a_forked_child_sees_the_environment_of_its_start(monkeypatch):
    monkeypatch.delenv("COURSE_START_METHOD", raising=False)
    monkeypatch.setenv("COURSE_PROCS_TEST", "first")
    ppid, value, torch_loaded = _child_view("COURSE_PROCS_TEST")  # starts the server (once per process)
    assert value == "first"
    monkeypatch.setenv("COURSE_PROCS_TEST", "second")  # set after the server started: it must still arrive
    ppid2, value2, torch_loaded2 = _child_view("COURSE_PROCS_TEST")
    assert value2 == "second"
    if procs.start_method() == "forkserver":
        assert ppid == ppid2 != os.getpid(), "children are forks of one server, not of this process"
        assert torch_loaded and torch_loaded2, "the server preloads torch, so a child starts with it imported"


def test_spawn_can_be_asked_for(monkeypatch):
    monkeypatch.setenv("COURSE_START_METHOD", "spawn")
    assert procs.start_method() == "spawn"
    assert procs.context().get_start_method() == "spawn"
    ppid, value, _ = _child_view("COURSE_START_METHOD")
    assert ppid == os.getpid() and value == "spawn"


def test_bad_input_is_named(monkeypatch):
    monkeypatch.setenv("COURSE_START_METHOD", "fork")
    with pytest.raises(ValueError, match="COURSE_START_METHOD"):
        procs.context()
    monkeypatch.delenv("COURSE_START_METHOD")
    with pytest.raises(ValueError, match="target"):
        procs.process(procs.context(), "not callable")
    with pytest.raises(ValueError, match="env"):
        procs.run_with_env(["PATH"], print)


def test_only_linux_forks_by_default(monkeypatch):
    monkeypatch.delenv("COURSE_START_METHOD", raising=False)
    monkeypatch.setattr(procs.sys, "platform", "darwin")
    assert procs.start_method() == "spawn"
    monkeypatch.setattr(procs.sys, "platform", "linux")
    assert procs.start_method() == "forkserver"
