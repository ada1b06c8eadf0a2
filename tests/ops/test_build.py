"""The JIT build's lock (kdengine.ops.build.build_lock): a build killed mid-way leaves torch's lock file behind, and
the next load must not wait on it forever; a live build in another process is still waited for."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import textwrap
import time

import pytest

from kdengine.ops import build

# A stand-in for a build in another process: the flock held, torch's lock file created, "ready" printed, then either
# killed by the test (the lock file stays) or finishing after `hold` seconds (the lock file removed first).
HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    where, hold = sys.argv[1], float(sys.argv[2])
    fh = open(os.path.join(where, "kdengine.lock"), "a")
    fcntl.flock(fh, fcntl.LOCK_EX)
    open(os.path.join(where, "lock"), "w").close()
    print("ready", flush=True)
    time.sleep(hold)
    os.remove(os.path.join(where, "lock"))
""")


def _holder(where, hold):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(where), str(hold)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_stale_torch_lock_is_removed_with_a_message(tmp_path, capsys):
    (tmp_path / build.TORCH_LOCK).write_text("")
    with build.build_lock(tmp_path):
        assert not (tmp_path / build.TORCH_LOCK).exists()
    err = capsys.readouterr().err
    assert "stale build lock" in err and str(tmp_path / build.TORCH_LOCK) in err


def test_no_message_without_a_lock_file(tmp_path, capsys):
    with build.build_lock(tmp_path):
        pass
    assert capsys.readouterr().err == ""


def test_the_lock_of_a_killed_build_is_cleared(tmp_path, capsys):
    proc = _holder(tmp_path, 60)
    proc.kill()
    proc.wait()
    assert (tmp_path / build.TORCH_LOCK).exists()  # what a killed build leaves
    with build.build_lock(tmp_path):
        assert not (tmp_path / build.TORCH_LOCK).exists()
    assert "stale build lock" in capsys.readouterr().err


def test_a_live_build_is_waited_for_not_broken(tmp_path, capsys):
    proc = _holder(tmp_path, 1.0)
    t0 = time.monotonic()
    with build.build_lock(tmp_path):
        waited = time.monotonic() - t0
        assert not (tmp_path / build.TORCH_LOCK).exists()  # the holder removed its own lock file before releasing
    assert proc.wait(timeout=10) == 0  # its own remove found the file: it was not broken while the build lived
    err = capsys.readouterr().err
    assert "waiting for another process building" in err and "stale" not in err
    assert waited > 0.5


def test_load_extension_builds_under_the_lock(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from torch.utils import cpp_extension

    monkeypatch.setenv("KDENGINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "missing_toolchain", lambda: None)
    monkeypatch.setattr(build.shapes, "check_binding", lambda module: None)
    seen = {}

    def fake_load(name, build_directory, **kwargs):
        with open(f"{build_directory}/{build.OWN_LOCK}", "a") as fh:  # a second open file: the flock must be taken
            with pytest.raises(BlockingIOError):
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        seen["name"] = name
        return object()

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    build._LOADED.clear()
    try:
        build.load_extension("90")
    finally:
        build._LOADED.clear()
    assert seen["name"].startswith("kdengine_verify_vec_")


def test_without_flock_the_load_goes_ahead_as_before(tmp_path, monkeypatch, capsys):
    # a file system without flock (some network mounts): nothing is removed (no way to tell a live build), no crash
    import errno

    def no_flock(fh, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    (tmp_path / build.TORCH_LOCK).write_text("")
    entered = False
    with build.build_lock(tmp_path):
        entered = True
    assert entered and (tmp_path / build.TORCH_LOCK).exists() and capsys.readouterr().err == ""


def test_every_csrc_file_is_in_the_build_digest():
    # extension_name hashes SOURCES and HEADERS: a csrc file left out of them could change without a rebuild (the
    # loaded extension then runs the old code under the new name's promise)
    on_disk = {f.name for f in build.CSRC.iterdir() if f.suffix in (".cu", ".cuh", ".cpp", ".h")}
    assert on_disk == set(build.SOURCES) | set(build.HEADERS), on_disk ^ (set(build.SOURCES) | set(build.HEADERS))
