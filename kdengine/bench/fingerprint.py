"""The environment fingerprint recorded with every result: software versions, the GPU and its state,
and the commit. History only compares results whose comparable fields agree.

Clocks and throttle reasons come from nvidia-ml-py (`pynvml`) when importable, else from
`nvidia-smi --query-gpu`; `throttled(start, end)` says whether a run must not serve as a baseline.
`machine_name()` names the perf_history machine: `gpu-<gpu name>-sm<cc>` or `cpu-<arch>`.
"""

from __future__ import annotations

import platform
import re
import subprocess
import time
from pathlib import Path

from kdengine import env
from kdengine.bench import names

REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def software() -> dict:
    import torch  # here, not at the top: ci record/gate read fingerprints without paying torch's import

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
    }


def gpu() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"gpu": "cpu", "sm_count": 0, "cpu": platform.processor() or platform.machine()}
    from kdengine.bench import verify_timing

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "verify_timer": verify_timing.METHOD,  # how verify samples are taken (a GAP_S spin after each)
        "sm_count": props.multi_processor_count,
        "capability": f"sm_{props.major}{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "l2_mib": round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
        "driver": driver_version(),
        "gpu_uuid": gpu_uuid(props),
    }


def gpu_uuid(props) -> str | None:
    """The physical GPU's UUID (`GPU-...`, as nvidia-smi prints it), None when torch does not expose it.
    Not a comparable field: two runs on two H200s are comparable, but the gate notes the change, since
    boards of one model differ by ~1-2% (seen between machine sessions on the H200)."""
    uuid = getattr(props, "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def driver_version() -> str | None:
    """The NVIDIA driver version (nvml, else nvidia-smi), None when neither answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.strip()
            return out.splitlines()[0].strip() if out else None
        except (OSError, subprocess.SubprocessError):
            return None


def commit() -> dict:
    sha = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": sha, "dirty": bool(dirty) if dirty is not None else None}


def named_commit(info: dict, sha: str) -> dict:
    """`info` (a collect() dict) measuring `sha`, named by the run rather than read from the tree's .git: a device
    copy of a working tree whose git metadata is absent or stale. git's own reading is kept as git_head / git_dirty,
    and dirty is None (not known from here: the run that names the commit vouches for its tree)."""
    return {**info, "git_head": info.get("commit"), "git_dirty": info.get("dirty"), "commit": sha, "dirty": None}


def collect() -> dict:
    """A flat dict: software, GPU identity, commit, and the environment overrides that change what is
    measured (`overrides`: kdengine.env.measurement_overrides, "" for none; history compares only runs
    that agree on it). (Clocks and throttling are added by the timer.)"""
    return {**software(), **gpu(), **commit(), "overrides": env.measurement_overrides()}


# --- machine name ---------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_name(info: dict | None = None) -> str:
    """`gpu-nvidia-h200-sm90` on a GPU, `cpu-x86_64` without one (from `info` = gpu() if given); always
    within kdengine.bench.names' machine character set (ValueError otherwise)."""
    info = gpu() if info is None else info
    if info.get("sm_count", 0) and info.get("gpu", "cpu") != "cpu":
        cc = _slug(str(info.get("capability", "")).replace("sm_", ""))
        return names.check_machine_name(f"gpu-{_slug(str(info['gpu']))}-sm{cc}")
    arch = re.sub(r"[^A-Za-z0-9_]+", "-", platform.machine() or "unknown")
    return names.check_machine_name(f"cpu-{arch}")


# --- clocks and throttle reasons ------------------------------------------------------------------

# Throttle reason bits (NVML) that do not make a measurement suspect: GPU idle, application clocks.
BENIGN_REASONS = 0x1 | 0x2
REASON_NAMES = {
    0x1: "gpu_idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}
CLOCK_CHANGE_LIMIT = 0.05  # an SM clock change larger than this fraction marks the run throttled
# NVML's violation counters (ns the clocks were held down by the power cap, or by a thermal limit, since the
# driver loaded) are read beside the throttle reasons, which are only the state at the instant read: a run
# capped in its middle reads clean at both ends (the seesaw2 set of
# perf_history/kernel/verify_kernel_seesaw2_*_2503f03.json ended at 1860 MHz under sw_power_cap, while a row
# timed before it read ~10% slower than in another set of the same run). throttle_fraction reports the
# capped share of a span, and a span capped for more than VIOLATION_LIMIT of its time is `throttled`. With the
# verify timer's spin gaps no row of the H200's final run was capped (perf_history/kernel/final_e2a43f3/:
# every row 0%, the decode's counter did not move), so the flag marks a machine in trouble, not every heavy
# benchmark. GPUs whose NVML has no violation counters keep the instant reasons only.
VIOLATION_LIMIT = 0.05


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASON_NAMES.items() if mask & bit] + (
        [f"0x{mask & ~sum(REASON_NAMES):x}"] if mask & ~sum(REASON_NAMES) else []
    )


def _nvml_clocks(index: int) -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        read_reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = int(read_reasons(handle))
        counters = {}
        for key, policy in (("power_violation_ns", "NVML_PERF_POLICY_POWER"),
                            ("thermal_violation_ns", "NVML_PERF_POLICY_THERMAL")):
            try:
                counters[key] = int(pynvml.nvmlDeviceGetViolationStatus(handle, getattr(pynvml, policy)).violationTime)
            except Exception:  # not supported on this GPU / driver: the instant reasons only
                pass
        try:
            counters["power_limit_w"] = round(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0, 1)
        except Exception:
            pass
        return {
            "sm_mhz": int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            "mem_mhz": int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
            "temp_c": int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            "power_w": round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1),
            "throttle_mask": mask,
            "throttle_reasons": reason_names(mask),
            **counters,
            "t_s": time.monotonic(),
            "source": "nvml",
        }
    finally:
        pynvml.nvmlShutdown()


def parse_smi_line(line: str) -> dict:
    """One `nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,<reasons>` csv line."""
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 5:
        raise ValueError(f"nvidia-smi line: expected 5 fields, got {len(fields)} in {line!r}")

    def number(text: str):
        try:
            return float(text)
        except ValueError:
            return None

    mask = int(fields[4], 16) if fields[4].lower().startswith("0x") else 0
    sm, mem, temp, power = (number(f) for f in fields[:4])
    return {
        "sm_mhz": None if sm is None else int(sm),
        "mem_mhz": None if mem is None else int(mem),
        "temp_c": None if temp is None else int(temp),
        "power_w": power,
        "throttle_mask": mask,
        "throttle_reasons": reason_names(mask),
        "source": "nvidia-smi",
    }


def _smi_clocks(index: int) -> dict:
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        query = f"clocks.sm,clocks.mem,temperature.gpu,power.draw,{reasons}"
        try:
            out = subprocess.run(
                ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", f"--id={index}"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if out:
            return parse_smi_line(out.splitlines()[0])
    return {"source": "unavailable"}


def clocks(index: int | None = None) -> dict:
    """SM/memory clocks, temperature, power and throttle reasons of GPU `index` ({} without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    index = torch.cuda.current_device() if index is None else index
    try:
        return _nvml_clocks(index)
    except Exception:  # pynvml missing, or NVML not usable in this container
        return _smi_clocks(index)


def throttle_fraction(start: dict, end: dict) -> float | None:
    """The fraction of the span between two readings that NVML counted the clocks held down by the power
    cap or a thermal limit; None when the readings lack the counters or the timestamps."""
    t0, t1 = start.get("t_s"), end.get("t_s")
    if not t0 or not t1 or t1 <= t0:
        return None
    capped = [end[k] - start[k] for k in ("power_violation_ns", "thermal_violation_ns") if k in start and k in end]
    if not capped:
        return None
    return max(0.0, max(capped)) / 1e9 / (t1 - t0)


def throttled(start: dict, end: dict) -> bool:
    """True when a non-benign throttle reason was active at the start or the end, when NVML counted the
    clocks capped (power or thermal) for more than VIOLATION_LIMIT of the span between the readings, or
    when the SM clock moved more than CLOCK_CHANGE_LIMIT between two busy readings (a reading taken while
    the GPU was idle has a parked clock and is not compared)."""
    if not start and not end:
        return False
    for state in (start, end):
        if int(state.get("throttle_mask", 0)) & ~BENIGN_REASONS:
            return True
    frac = throttle_fraction(start, end)
    if frac is not None and frac > VIOLATION_LIMIT:
        return True
    idle = any(int(state.get("throttle_mask", 0)) & 0x1 for state in (start, end))
    a, b = start.get("sm_mhz"), end.get("sm_mhz")
    if a and b and not idle:  # an idle GPU parks its clock: a change from idle says nothing
        return abs(b - a) / max(a, b) > CLOCK_CHANGE_LIMIT
    return False
