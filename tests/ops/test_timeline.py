"""The opt-in in-kernel timeline (csrc/verify_timeline.cuh) on the CPU: the default build's PTX reads no
%globaltimer, the -DKDENGINE_TIMELINE build's marked kernels (the sm90 split kernel, the grouped merge) do; the
build flag reaches nvcc, the binding's host flags and the cache key; the kinds agree with kdengine.bench.timeline;
the Python wrappers name the macro when the loaded extension lacks the timeline."""

from __future__ import annotations

import re

import pytest

from kdengine.bench import timeline
from kdengine.ops import build, cuda_backend

from .ptx import kernel_bodies, unit_ptx
from .test_sm90 import kernel_name

SPLIT_ENTRY = kernel_name("seesaw2")  # the default schedule
MERGE_ENTRY = "verify_combine_grouped2_kernel"  # merge 4 and merge 7
LEAN_ENTRY = "verify_split_kernel_lean"  # the mma.sync default layout's split kernel


def compile_ptx(source: str, arch: str, timeline_build: bool) -> str:
    return unit_ptx(source, arch, (build.TIMELINE_MACRO,) if timeline_build else ())


def entries(ptx_text: str, name: str) -> list[str]:
    bodies = [body for entry_name, body in kernel_bodies(ptx_text).items() if name in entry_name]
    assert bodies, f"no {name} entry in the PTX"
    return bodies


@pytest.mark.nvcc
@pytest.mark.parametrize(("source", "arch", "name"), [("verify_sm90.cu", "90a", SPLIT_ENTRY),
                                                      ("verify_kernel.cu", "90", MERGE_ENTRY),
                                                      ("verify_kernel.cu", "90", LEAN_ENTRY)])
def test_only_the_timeline_build_reads_the_globaltimer(source, arch, name):
    assert "globaltimer" not in compile_ptx(source, arch, False)
    # four marks in every kernel of that name, every instantiation (split kernels: the empty split's end, start,
    # trigger, end; the merge: start, waited, and the end on each of its two exits)
    for marked in entries(compile_ptx(source, arch, True), name):
        assert "%smid" in marked and marked.count("%globaltimer") >= 4


def test_the_timeline_flag_reaches_nvcc_the_binding_and_the_cache_key():
    archs = ("90",)
    assert f"-D{build.TIMELINE_MACRO}" in build.nvcc_flags(archs, timeline=True)
    assert not any(build.TIMELINE_MACRO in f for f in build.nvcc_flags(archs))
    assert f"-D{build.TIMELINE_MACRO}" in build.host_cflags(timeline=True)
    assert build.host_cflags() == build.HOST_CFLAGS
    names = {build.extension_name(archs, s, t) for s in (False, True) for t in (False, True)}
    assert len(names) == 4
    assert "timeline" in build.extension_name(archs, False, True)
    assert "verify_timeline.cuh" in build.HEADERS  # an edit of the header rebuilds


def test_the_timeline_build_is_chosen_by_flag_or_variable(monkeypatch, tmp_path):
    from kdengine import env
    from kdengine.cli import build_parser

    args = build_parser().parse_args(["build", "--arch", "90", "--timeline"])
    assert args.timeline
    assert not build_parser().parse_args(["build"]).timeline
    monkeypatch.delenv(env.TIMELINE_VAR, raising=False)
    assert env.timeline_build() is False
    monkeypatch.setenv(env.TIMELINE_VAR, "1")
    assert env.timeline_build() is True
    monkeypatch.setenv(env.TIMELINE_VAR, "yes")
    with pytest.raises(ValueError, match=env.TIMELINE_VAR):
        env.timeline_build()
    assert env.TIMELINE_VAR in env.MEASUREMENT_VARS  # a timed run of the timeline build is marked as such
    # load_extension keys its process cache by the variant: the variable picks the timeline build
    seen = []
    monkeypatch.setattr(build, "missing_toolchain", lambda: "stop")
    monkeypatch.setattr(build, "_LOADED", {(("90",), False, True): "timeline module", (("90",), False, False): "plain"})
    monkeypatch.setenv(env.TIMELINE_VAR, "1")
    seen.append(build.load_extension("90"))
    monkeypatch.setenv(env.TIMELINE_VAR, "0")
    seen.append(build.load_extension("90"))
    seen.append(build.load_extension("90", timeline=True))
    assert seen == ["timeline module", "plain", "timeline module"]


def test_the_kinds_match_the_header():
    header = (build.CSRC / "verify_timeline.cuh").read_text()
    enum = re.search(r"enum Kind : int \{(.*?)\};", header, re.S).group(1)
    pairs = re.findall(r"(\w+) = (\d+),", enum)
    assert [(name.lower(), int(v)) for name, v in pairs if name != "NUM_KINDS"] == \
        [(name, i) for i, name in enumerate(timeline.KINDS)]


def test_the_wrappers_name_the_macro_without_the_timeline_build(monkeypatch):
    monkeypatch.setattr(build, "load_extension", lambda *a, **k: object())
    for fn in (cuda_backend.timeline_reset, cuda_backend.timeline_read):
        with pytest.raises(RuntimeError, match=f"without -D{build.TIMELINE_MACRO}"):
            fn()
