"""Does a failing TORCH_CHECK whose message formats a number crash an extension built with given host flags? A
four-function extension is built with the binding's former host flags (-O3 -std=c++17: it did crash, on the H200's
torch 2.11, perf_history/kernel/pdl_288100a/) and with torch's defaults; each failing check runs in its own process,
also with the number formatted by std::to_string into a string argument (the binding's form since). Prints one line
per case. KD_PROBE_FLAGS (default "torch,ours") and KD_PROBE_EXT ("0,1": without / with our extension loaded first)
pick the cases.

    python3 ci/gpu/torch_check_probe.py            (all cases)
    python3 ci/gpu/torch_check_probe.py FLAGS FN   (one case in this process)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <torch/extension.h>
void f_none(int64_t x) { TORCH_CHECK(x <= 3, "x must be <= 3"); }
void f_dtype(const at::Tensor& t) { TORCH_CHECK(t.scalar_type() == at::kBFloat16, "dtype: got ", t.scalar_type()); }
void f_int(int64_t x) { TORCH_CHECK(x <= 3, "x must be <= 3, got ", x); }
void f_double(double x) { TORCH_CHECK(x > 0, "x must be > 0, got ", x); }
void f_int_str(int64_t x) { TORCH_CHECK(x <= 3, "x must be <= 3, got " + std::to_string(x)); }
void f_double_str(double x) { TORCH_CHECK(x > 0, "x must be > 0, got " + std::to_string(x)); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("f_none", &f_none); m.def("f_dtype", &f_dtype); m.def("f_int", &f_int); m.def("f_double", &f_double);
  m.def("f_int_str", &f_int_str); m.def("f_double_str", &f_double_str);
}
"""
FLAGS = {"ours": ["-O3", "-std=c++17"], "torch": []}
ARGS = {"f_none": 7, "f_int": 7, "f_double": -1.0, "f_int_str": 7, "f_double_str": -1.0}
FNS = ("f_none", "f_dtype", "f_int", "f_double", "f_int_str", "f_double_str")


def build(flags: str):
    from torch.utils.cpp_extension import load

    d = Path(os.environ.get("KD_PROBE_DIR", tempfile.gettempdir())) / f"tcp_{flags}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "t.cpp").write_text(SOURCE)
    return load(f"tcp_{flags}", [str(d / "t.cpp")], extra_cflags=FLAGS[flags], build_directory=str(d))


def one(flags: str, fn: str) -> int:
    import torch

    if os.environ.get("KD_PROBE_WITH_EXT") == "1":  # our extension loaded (and CUDA initialised) first
        from kdengine.ops import build as kbuild

        kbuild.load_extension()
        torch.zeros(1, device="cuda")
    m = build(flags)
    try:
        getattr(m, fn)(ARGS.get(fn, torch.zeros(1)))
    except RuntimeError as exc:
        print("raised:", str(exc).splitlines()[0])
        return 0
    print("DID NOT RAISE")
    return 3


def main() -> int:
    if len(sys.argv) == 3:
        return one(*sys.argv[1:])
    flag_sets = os.environ.get("KD_PROBE_FLAGS", "torch,ours").split(",")
    for flags in flag_sets:  # build each once in this process (the children find it built)
        build(flags)
    bad = 0
    for with_ext in os.environ.get("KD_PROBE_EXT", "0,1").split(","):
        for flags in flag_sets:
            for fn in FNS:
                r = subprocess.run([sys.executable, "-X", "faulthandler", __file__, flags, fn], capture_output=True,
                                   text=True, timeout=300, env={**os.environ, "KD_PROBE_WITH_EXT": with_ext})
                out = (r.stdout + r.stderr).strip().splitlines()
                print(f"ext loaded {with_ext} flags {flags:5s} {fn:9s} exit {r.returncode:4d}  {out[0] if out else ''}",
                      flush=True)
                bad += r.returncode != 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
