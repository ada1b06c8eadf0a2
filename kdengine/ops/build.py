"""JIT build of the CUDA verify kernel (csrc/) through torch.utils.cpp_extension (ninja), cached
under kdengine.env.cache_dir(), and the `kdengine build` subcommand that compiles it ahead of time.

The nvcc flags live here and only here (`nvcc_flags`). `--arch all` targets sm_80, sm_90, sm_100,
sm_120 plus PTX of the newest; `--arch native` only the local GPU (fast, for a runner). The arch list
a `kdengine build` chose is remembered, so the JIT load on first use picks the same build. The timeline
build (`--timeline`, or KDENGINE_TIMELINE=1 for the JIT load: csrc/verify_timeline.cuh) is a variant of its own
name, so it never replaces the normal build.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sys
from pathlib import Path

from kdengine import env
from kdengine.ops import shapes


def find_csrc() -> Path:
    """The CUDA sources: kdengine/_csrc in an installed wheel (package data copied from csrc/), else the
    checkout's top-level csrc/ (editable install, tests)."""
    packaged = Path(__file__).resolve().parents[1] / "_csrc"
    return packaged if (packaged / "verify_kernel.cu").is_file() else Path(__file__).resolve().parents[2] / "csrc"


CSRC = find_csrc()
SOURCES = ("verify_api.cpp", "verify_kernel.cu", "verify_sm90.cu")
HEADERS = ("verify_kernel.cuh", "verify_wide.cuh", "verify_wide_lean.cuh", "verify_sm90.cuh", "sm90_ptx.cuh",
           "verify_partials.cuh", "verify_timeline.cuh", "verify_launch.h", "static_switch.h", "merge_spread.h")
ALL_ARCHS = ("80", "90", "100", "120")
SCALAR_LOADS_MACRO = "KDENGINE_SCALAR_LOADS"
TIMELINE_MACRO = "KDENGINE_TIMELINE"


# --- flags ------------------------------------------------------------------------------------------


def native_arch() -> str:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("--arch native needs a CUDA device; none is visible")
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def resolve_archs(spec: str) -> tuple[str, ...]:
    """'all' -> every target arch; 'native' -> the local GPU's; '90,120' -> those (validated)."""
    spec = spec.strip().lower()
    if spec == "all":
        return ALL_ARCHS
    if spec == "native":
        return (native_arch(),)
    archs = tuple(a.strip().removeprefix("sm_") for a in spec.split(",") if a.strip())
    if not archs or not all(a.isdigit() and len(a) in (2, 3) for a in archs):
        raise ValueError(f"arch: expected 'all', 'native' or a list like '90,120', got {spec!r}")
    return archs


# Hopper is built as sm_90a (the arch-specific target: wgmma, setmaxnreg for csrc/verify_sm90.cuh);
# the mma.sync kernels compile for it unchanged. One SASS per arch, so the loader has no choice to make.
ARCH_SPECIFIC = {"90": "90a"}


def gencode_flags(archs: tuple[str, ...], ptx: bool = True) -> list[str]:
    """SASS for every arch (sm_90 as sm_90a), plus PTX of the newest so later GPUs can JIT it."""
    flags = [f"-gencode=arch=compute_{ARCH_SPECIFIC.get(a, a)},code=sm_{ARCH_SPECIFIC.get(a, a)}" for a in archs]
    if ptx:
        newest = max(archs, key=int)
        flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    return flags


# The host flags of the binding (verify_api.cpp, the one translation unit that includes torch): no -std, so it is
# compiled with the C++ standard torch's cpp_extension picks for the installed torch (C++20 in torch 2.13's) and its
# inline headers match the library's. (This did not stop the checks that format a number from crashing on the H200
# image, perf_history/kernel/final_f208c48/: the binding formats its numbers itself, verify_api.cpp num().) The
# kernels' .cu files include no torch header and keep nvcc_flags' -std=c++17.
HOST_CFLAGS = ["-O3"]


def host_cflags(*, timeline: bool = False) -> list[str]:
    """The binding's host flags: HOST_CFLAGS, plus the timeline macro (it registers timeline_reset / _read)."""
    return [*HOST_CFLAGS, f"-D{TIMELINE_MACRO}"] if timeline else list(HOST_CFLAGS)


def nvcc_flags(archs: tuple[str, ...], *, scalar_loads: bool = False, ptx: bool = True,
               timeline: bool = False) -> list[str]:
    """Every nvcc flag of the kernel build (the one place they are written)."""
    flags = ["-O3", "-std=c++17", "-lineinfo", "--expt-relaxed-constexpr", *gencode_flags(archs, ptx)]
    if scalar_loads:
        flags.append(f"-D{SCALAR_LOADS_MACRO}")
    if timeline:
        flags.append(f"-D{TIMELINE_MACRO}")
    return flags


def extension_name(archs: tuple[str, ...], scalar_loads: bool, timeline: bool = False) -> str:
    """A name per flag set and source content, so variants and edits never share a build dir."""
    flags = [*nvcc_flags(archs, scalar_loads=scalar_loads, timeline=timeline), *host_cflags(timeline=timeline)]
    digest = hashlib.sha1(" ".join(flags).encode())
    for name in (*SOURCES, *HEADERS):
        digest.update((CSRC / name).read_bytes())
    variant = ("scalar" if scalar_loads else "vec") + ("_timeline" if timeline else "")
    return f"kdengine_verify_{variant}_{digest.hexdigest()[:10]}"


# --- build and load ---------------------------------------------------------------------------------

_LOADED: dict[tuple, object] = {}


def build_dir(name: str) -> Path:
    """Where the extension `name` (extension_name) is built and cached; its module is `name`.so there."""
    return env.cache_dir() / "build" / name


def _arch_marker() -> Path:
    return env.cache_dir() / "verify_arch.txt"


def default_arch_spec() -> str:
    """The arch list of the last `kdengine build` on this machine, else 'all'."""
    marker = _arch_marker()
    return marker.read_text().strip() if marker.exists() else "all"


def missing_toolchain() -> str | None:
    """None when nvcc and ninja are usable, else the reason."""
    if shutil.which("nvcc") is None:
        return "nvcc not found on PATH (install the CUDA toolkit or use backend='triton')"
    try:
        from torch.utils.cpp_extension import verify_ninja_availability

        verify_ninja_availability()
    except RuntimeError:
        return "ninja not found (pip install ninja)"
    return None


TORCH_LOCK = "lock"  # torch.utils.cpp_extension's FileBaton in the build directory
OWN_LOCK = "kdengine.lock"


@contextlib.contextmanager
def build_lock(where: Path):
    """Hold an flock on `where`/kdengine.lock for the JIT load. torch's loader guards a build with a plain lock file
    that a killed build (a timeout, ^C, OOM) leaves behind, and every later load then waits on it forever in
    silence. The flock dies with its process, so while it is held no other kdengine load is building here and a torch
    lock file found is stale: it is removed, with a line on stderr. A live build in another process is waited for,
    with a line saying so."""
    import fcntl

    with open(where / OWN_LOCK, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"kdengine: waiting for another process building {where.name} ({where})", file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError:  # a file system without flock (some network mounts): torch's own lock alone, as before
            yield
            return
        try:
            stale = where / TORCH_LOCK
            if stale.exists():
                stale.unlink()
                print(f"kdengine: removed a stale build lock {stale} (left by a build that was killed)", file=sys.stderr,
                      flush=True)
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load_extension(arch: str | None = None, *, scalar_loads: bool = False, timeline: bool | None = None,
                   verbose: bool = False):
    """Build (first time) and import the extension module; cached per process and on disk. timeline None: the
    KDENGINE_TIMELINE variable (kdengine.env.timeline_build) picks the timeline build or the normal one."""
    archs = resolve_archs(arch or default_arch_spec())
    timeline = env.timeline_build() if timeline is None else timeline
    key = (archs, scalar_loads, timeline)
    if key in _LOADED:
        return _LOADED[key]
    reason = missing_toolchain()
    if reason is not None:
        raise RuntimeError(reason)
    from torch.utils.cpp_extension import load

    name = extension_name(archs, scalar_loads, timeline)
    where = build_dir(name)
    where.mkdir(parents=True, exist_ok=True)
    with build_lock(where):
        module = load(
            name=name,
            sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=host_cflags(timeline=timeline),
            extra_cuda_cflags=nvcc_flags(archs, scalar_loads=scalar_loads, timeline=timeline),
            extra_include_paths=[str(CSRC)],
            build_directory=str(where),
            verbose=verbose,
        )
    shapes.check_binding(module)  # the C++ shape constants must equal kdengine.ops.shapes
    _LOADED[key] = module
    return module


# --- `kdengine build` -------------------------------------------------------------------------------


def _run_build(args) -> int:
    spec = ",".join(resolve_archs(args.arch)) if args.arch != "all" else "all"
    load_extension(spec, scalar_loads=args.scalar_loads, timeline=args.timeline, verbose=args.verbose)
    if not args.scalar_loads:  # (a timeline build too: the KDENGINE_TIMELINE=1 load then finds it without --arch)
        _arch_marker().write_text(spec)
    name = extension_name(resolve_archs(spec), args.scalar_loads, args.timeline)
    print(f"built {name} for sm_{', sm_'.join(resolve_archs(spec))}")
    return 0


def add_parser(sub) -> None:
    parser = sub.add_parser("build", help="compile the CUDA verify kernel ahead of time (JIT cache)")
    parser.add_argument("--arch", default="all", help="'all' (sm_80,90,100,120 + PTX), 'native', or e.g. '90,120'")
    parser.add_argument("--scalar-loads", action="store_true", help="the 4-byte KV load ablation build")
    parser.add_argument("--timeline", action="store_true",
                        help="the in-kernel timeline build (-DKDENGINE_TIMELINE; loaded where KDENGINE_TIMELINE=1)")
    parser.add_argument("--verbose", action="store_true", help="show the ninja/nvcc output")
    parser.set_defaults(func=_run_build)


def main(argv: list[str] | None = None) -> int:
    """`python -m kdengine.ops.build` == `kdengine build` (no other CLI modules imported)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kdengine.ops.build")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["build", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
