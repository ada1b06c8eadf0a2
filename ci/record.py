"""Record new results into perf_history/, all or nothing, and commit and push them so no run is lost.

Contract:
- A batch (`--from` DIR, perf_history layout) is staged and validated before anything is written: every
  entry must be a regular file or directory (symlinks, FIFOs, devices refused), every JSON file must be an
  asv benchmarks index (version 2), machine.json (version 1), asv result file (version 2) or samples
  sidecar (schema 1 or 2), with names in kdengine.bench.names' character sets, and the merged history
  must load. Destination directories must not be symlinks.
- The batch and the regenerated records/*.txt are installed under a journal (results_dir/.record-journal
  .json): a crash at any point is rolled back by the next record (or `recover`) to the old state; with a
  repository the journal lives until the commit exists, so an uncommitted install never outlives a crash.
- A samples sidecar names one run (<sha>-<run_id>.json): an existing one is never replaced (identical
  bytes are skipped, different bytes refused). asv keeps one result file per commit and environment: a
  second run of one commit replaces it (asv's semantics), and the output says so; both sidecars stay.
- Before anything else a record aborts a rebase left by a killed record, removes git lock files it left,
  and refuses a detached HEAD. Pushes fetch, rebase (records regenerated from the merged results) and
  retry; never a force push.

`python -m ci record --from NEW_RESULTS_DIR [--results-dir perf_history] [--repo .] [--push]
[--remote origin] [--branch main]`; `--recover` only repairs; `--export DIR` copies the results this checkout
has not committed to DIR (the GPU job hands them to the job that records them).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from ci import history, report
from kdengine.bench import names

SKIP_MARK = "[skip perf]"
RECORD_FILE = "verify_kernel_cudagraph.txt"
RECORDS_REL = f"records/{RECORD_FILE}"
JOURNAL = history.RECORD_JOURNAL
STAGING_PREFIX = ".record-staging-"
BATCH_TRAILER = "Record-batch:"
SHA_RE = re.compile(r"[0-9a-f]{40}")
RUN_ID_RE = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}")
ENV_NAME_RE = re.compile(r"[A-Za-z0-9._+-]{1,200}")
SIDECAR_SCHEMAS = (1, 2)
GIT_LOCKS = ("index.lock", "HEAD.lock", "ORIG_HEAD.lock", "packed-refs.lock", "config.lock")


# --- validation ----------------------------------------------------------------------------------------


def check(condition: bool, path: Path, message: str) -> None:
    if not condition:
        raise history.DataError(f"{path}: {message}")


def check_names(path: Path, *pairs) -> None:
    """Each (checker, value, what): a ValueError becomes a DataError naming the file."""
    for checker, value, what in pairs:
        try:
            checker(value, what)
        except ValueError as exc:
            raise history.DataError(f"{path}: {exc}") from None


def check_benchmarks(path: Path, data: dict) -> None:
    check(data.get("version") == 2, path, f"asv benchmarks index version 2 expected, got {data.get('version')!r}")
    for key, entry in data.items():
        if key == "version":
            continue
        check(isinstance(entry, dict) and entry.get("name") == key, path, f"entry {key[:80]!r} is malformed")
        check_names(path, (names.check_asv_name, key, "benchmark name"),
                    (names.check_plain_text, entry.get("unit", ""), f"{key} unit"),
                    *((names.check_asv_name, n, f"{key} param name") for n in entry.get("param_names") or []),
                    *((names.check_asv_param, v, f"{key} param") for vs in entry.get("params") or [] for v in vs))


def check_machine(path: Path, data: dict, machine: str) -> None:
    check(data.get("version") == 1, path, f"asv machine.json version 1 expected, got {data.get('version')!r}")
    check(data.get("machine") == machine, path, f"machine {data.get('machine')!r} != directory {machine!r}")
    for key, value in data.items():
        check(value is None or isinstance(value, (str, int, float)), path, f"{key!r} is not a plain value")
    check_names(path, *((names.check_plain_text, v, k) for k, v in data.items() if isinstance(v, str)))


def check_asv_result(path: Path, data: dict, machine: str) -> None:
    check(data.get("version") == 2, path, f"asv result version 2 expected, got {data.get('version')!r}")
    for key in ("commit_hash", "env_name", "date", "params", "result_columns", "results"):
        check(key in data, path, f"asv result without {key!r}")
    sha, env_name = data["commit_hash"], data["env_name"]
    check(isinstance(sha, str) and SHA_RE.fullmatch(sha) is not None, path, f"commit_hash {sha!r} is not a sha")
    check(isinstance(env_name, str) and ENV_NAME_RE.fullmatch(env_name) is not None, path,
          f"env_name {env_name!r} outside [A-Za-z0-9._+-]")
    check(path.name == f"{sha[:8]}-{env_name}.json", path, f"name should be {sha[:8]}-{env_name}.json")
    check(isinstance(data["params"], dict) and data["params"].get("machine") == machine, path,
          f"params.machine != directory {machine!r}")
    columns = data["result_columns"]
    check(isinstance(columns, list) and "result" in columns and "params" in columns, path,
          "result_columns must list 'result' and 'params'")
    check(isinstance(data["results"], dict), path, "results must be an object")
    at = columns.index("params")
    for name, row in data["results"].items():
        check(isinstance(row, list), path, f"result row {name[:80]!r} is not a list")
        params = row[at] if len(row) > at and row[at] else []
        check(isinstance(params, list) and all(isinstance(vs, list) for vs in params), path,
              f"params of {name[:80]!r} malformed")
        check_names(path, (names.check_asv_name, name, "benchmark name"),
                    *((names.check_asv_param, v, f"{name} param") for vs in params for v in vs))


def check_sidecar(path: Path, data: dict, machine: str) -> None:
    schema = data.get("schema")
    check(schema in SIDECAR_SCHEMAS, path, f"samples schema {schema!r} is not one of {SIDECAR_SCHEMAS}")
    for key in ("commit", "machine", "results"):
        check(key in data, path, f"samples sidecar without {key!r}")
    sha = data["commit"]
    check(isinstance(sha, str) and SHA_RE.fullmatch(sha) is not None, path, f"commit {sha!r} is not a sha")
    check(data["machine"] == machine, path, f"machine {data['machine']!r} != directory {machine!r}")
    if schema == 1:
        check(path.stem == sha, path, f"a schema 1 sidecar is named {sha}.json")
    else:
        run_id = data.get("run_id")
        check(isinstance(run_id, str) and RUN_ID_RE.fullmatch(run_id) is not None, path,
              f"run_id {run_id!r} is not YYYYMMDDTHHMMSSZ-xxxxxx")
        check(path.stem == f"{sha}-{run_id}", path, f"a schema 2 sidecar is named {sha}-{run_id}.json")
    check(isinstance(data["results"], dict), path, "results must be an object")
    for workload, res in data["results"].items():
        check(isinstance(res, dict), path, f"result {workload[:80]!r} is not an object")
        check_names(path, (names.check_workload_name, workload, "workload name"),
                    (names.check_plain_text, res.get("unit") or "", f"{workload} unit"))


def machines_in(results_dir: Path) -> set[str]:
    """asv machine directories of a results directory: those holding a machine.json."""
    return {p.parent.name for p in Path(results_dir).glob("*/machine.json")}


def classify(rel: Path, machines: set[str]) -> tuple[str, str | None]:
    """(kind, machine) of a path inside a results directory; kind '' when record does not install it (the
    kernel/, tp/, ... records of other tools: directories without a machine.json)."""
    parts = rel.parts
    if parts == ("benchmarks.json",):
        return "benchmarks", None
    if len(parts) == 2 and parts[1] == "machine.json":
        return "machine", parts[0]
    if len(parts) == 2 and parts[0] in machines:
        return "result", parts[0]
    if len(parts) == 3 and parts[0] == "samples":
        return "sidecar", parts[1]
    return "", None


def validate(path: Path, rel: Path, raw: bytes, machines: set[str]) -> str:
    """Check one incoming file (machines: the asv machine directories); returns its kind. DataError naming
    the file otherwise."""
    kind, machine = classify(rel, machines)
    check(kind != "", path, "not an asv result (of a directory with a machine.json), machine.json, "
                            "benchmarks.json or samples sidecar (record installs only those)")
    if machine is not None:
        check_names(path, (names.check_machine_name, machine, "machine directory"))
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise history.DataError(f"corrupt or truncated result file {path}: {exc}") from None
    check(isinstance(data, dict), path, f"expected a JSON object, got {type(data).__name__}")
    if kind == "benchmarks":
        check_benchmarks(path, data)
    elif kind == "machine":
        check_machine(path, data, machine)
    elif kind == "result":
        check_asv_result(path, data, machine)
    else:
        check_sidecar(path, data, machine)
    return kind


# --- staging -------------------------------------------------------------------------------------------


def read_batch(src: Path, results_dir: Path) -> dict[str, tuple[str, bytes]]:
    """{relative path: (kind, bytes)} of every result file under src, all validated (asv result files belong to
    a machine directory with a machine.json in src or results_dir); non-JSON regular files (the runner's
    JSONL scratch) are left out. Symlinks and special files anywhere are refused."""
    src = Path(src)
    check(src.is_dir() and not src.is_symlink(), src, "--from must be a directory (not a symlink)")
    machines = machines_in(src) | machines_in(results_dir)
    batch: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(src):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            check(stat.S_ISDIR(mode) or stat.S_ISREG(mode), path,
                  f"refusing a {'symlink' if stat.S_ISLNK(mode) else 'special file'} in --from")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.suffix != ".json":
                continue
            rel = path.relative_to(src)
            with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as fh:
                raw = fh.read()
            batch[rel.as_posix()] = (validate(path, rel, raw, machines), raw)
    check(bool(batch), src, "--from: no result files")
    return batch


def check_destination(results_dir: Path, rel: str) -> Path:
    """results_dir/rel, refusing a symlink anywhere on the way (results_dir itself included), a file where a
    directory belongs, or a destination that is not a regular file."""
    dest = results_dir
    for part in ("", *Path(rel).parts):
        dest = dest / part if part else dest
        if dest.is_symlink():
            raise history.DataError(f"{dest}: a symlink in the results directory; record writes only inside "
                                    "real directories")
        if dest != results_dir / rel and dest.exists() and not dest.is_dir():
            raise history.DataError(f"{dest}: expected a directory")
    if dest.exists() and not stat.S_ISREG(dest.lstat().st_mode):
        raise history.DataError(f"{dest}: not a regular file; refusing to replace it")
    return dest


def plan(batch: dict[str, tuple[str, bytes]], results_dir: Path) -> tuple[dict[str, bytes], list[str], list[str]]:
    """(files to write, asv results replaced by another run, files already present byte for byte)."""
    writes, replaced, same = {}, [], []
    for rel, (kind, raw) in batch.items():
        dest = check_destination(results_dir, rel)
        if dest.exists():
            old = dest.read_bytes()
            if old == raw:
                same.append(rel)
                continue
            if kind == "sidecar":
                raise history.DataError(f"{dest}: run already recorded with other content; a run's "
                                        "samples are never replaced (a new run has a new run id)")
            if kind == "result":
                replaced.append(rel)
        writes[rel] = raw
    return writes, replaced, same


def link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def render_records(results_dir: Path, writes: dict[str, bytes]) -> bytes:
    """The records file of results_dir with `writes` applied, computed on a linked copy (the real
    directory is untouched; a merged history that does not load stops the record here)."""
    with tempfile.TemporaryDirectory(prefix="kdengine-record-") as tmp:
        view = Path(tmp) / "view"
        if results_dir.is_dir():
            shutil.copytree(results_dir, view, copy_function=link_or_copy,
                            ignore=lambda d, entries: [e for e in entries if e.startswith(".") or e == "records"])
        for rel, raw in writes.items():
            (view / rel).parent.mkdir(parents=True, exist_ok=True)
            (view / rel).unlink(missing_ok=True)
            (view / rel).write_bytes(raw)
        view.mkdir(exist_ok=True)
        return (kernel_section(view) + format_record(history.load_all(view))).encode()


# --- journaled install ---------------------------------------------------------------------------------


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def install(results_dir: Path, writes: dict[str, bytes], batch_id: str, head: str | None) -> Path:
    """Write every file of `writes` (relative path -> bytes) under results_dir as one transaction; the
    journal stays (returned) until finish() is called: a crash before that is rolled back by recover()."""
    results_dir.mkdir(parents=True, exist_ok=True)
    staging = results_dir / f"{STAGING_PREFIX}{batch_id}"
    staging.mkdir()
    entries = []
    for i, (rel, raw) in enumerate(sorted(writes.items())):
        dest = results_dir / rel
        write_durable(staging / f"{i}.new", raw)
        existed = dest.exists()
        if existed:
            link_or_copy(str(dest), str(staging / f"{i}.old"))
        entries.append({"rel": rel, "existed": existed})
    new_dirs = sorted({str(p.relative_to(results_dir)) for rel in writes for p in (results_dir / rel).parents
                       if p != results_dir and results_dir in p.parents and not p.exists()}, key=len)
    fsync_dir(staging)
    journal = results_dir / JOURNAL
    tmp = results_dir / f"{JOURNAL}.tmp"
    write_durable(tmp, json.dumps({"batch": batch_id, "staging": staging.name, "head": head,
                                   "entries": entries, "new_dirs": new_dirs}).encode())
    os.replace(tmp, journal)  # from here on the install is in progress: recover() rolls it back
    fsync_dir(results_dir)
    for d in new_dirs:
        (results_dir / d).mkdir(exist_ok=True)
    for i, entry in enumerate(entries):
        os.replace(staging / f"{i}.new", results_dir / entry["rel"])
    return journal


def finish(results_dir: Path) -> None:
    """The installed batch is final (committed, or no repository): drop the journal, then the staging."""
    journal = results_dir / JOURNAL
    data = json.loads(journal.read_text())
    journal.unlink()
    fsync_dir(results_dir)
    shutil.rmtree(results_dir / data["staging"], ignore_errors=True)


def roll_back(results_dir: Path, data: dict) -> None:
    """Undo an unfinished install (idempotent: a crash during roll_back is rolled back again)."""
    staging = results_dir / data["staging"]
    for i, entry in enumerate(data["entries"]):
        dest, old = results_dir / entry["rel"], staging / f"{i}.old"
        if entry["existed"]:
            if old.exists():
                os.replace(old, dest)
        else:
            dest.unlink(missing_ok=True)
    for d in sorted(data["new_dirs"], key=len, reverse=True):
        with contextlib.suppress(OSError):
            (results_dir / d).rmdir()


def batch_committed(repo, data: dict) -> bool:
    if not data.get("head"):
        return False
    log = repo.git.log("--format=%B", f"{data['head']}..HEAD", "--grep", f"{BATCH_TRAILER} {data['batch']}",
                       "--fixed-strings")
    return bool(log.strip())


def recover_install(results_dir: Path, repo=None) -> list[str]:
    """Finish or undo what a killed record left in results_dir; returns what was done."""
    done = []
    journal = results_dir / JOURNAL
    if journal.exists():
        data = json.loads(journal.read_text())
        rels = [e["rel"] for e in data["entries"]]
        if repo is not None and batch_committed(repo, data):
            done.append(f"batch {data['batch']} was committed before the crash: kept")
        else:
            roll_back(results_dir, data)
            done.append(f"rolled back the unfinished batch {data['batch']} ({len(rels)} files)")
        if repo is not None:  # the index follows HEAD for those paths (a kill between add and commit)
            repo.git.reset("-q", "--", *[str((results_dir / r).resolve().relative_to(repo_root(repo)))
                                         for r in rels])
        journal.unlink()
    (results_dir / f"{JOURNAL}.tmp").unlink(missing_ok=True)
    if results_dir.is_dir():
        for stale in results_dir.glob(f"{STAGING_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
            done.append(f"removed {stale.name}")
    return done


# --- records -------------------------------------------------------------------------------------------


def _verify_line(r: dict, tail: str = "") -> str:
    time_s = report.format_number(r["time"], "seconds") if r["time"] else "—"
    tok = f"{r['tok_s']:.4g}" if r["tok_s"] else "—"
    speed = f"{r['speedup']:.2f}x" if r["speedup"] else "—"
    ctx = f"{r['ctx'] // 1024}k" if r["ctx"] % 1024 == 0 else str(r["ctx"])
    return (f"{ctx:>6} {r['T']:>4}  {r['backend']:<14} {time_s:>12} {tok:>12} "
            f"{speed:>9} {r['nsplit'] if r['nsplit'] is not None else '—':>6}"
            + ("  (throttled)" if r["throttled"] else "") + tail)


def _date(run: history.Run, fmt: str = "%Y-%m-%d %H:%M UTC") -> str:
    return datetime.fromtimestamp(run.date, tz=timezone.utc).strftime(fmt)


def format_record(runs_by_machine: dict[str, list[history.Run]]) -> str:
    """Per machine, the verify table of its newest run on the tracked branch (a run's sidecar says whether the branch
    held the commit when it ran; without any such run, the newest run), with that run's ours / peer ratios (those
    need one run). Newer runs off the branch (a gate check's empty commit, a side branch) are named below it. A run
    that measured only some workloads (a gate check's --bench-filter) is followed by the newest value of each workload
    it left out, each with the run it comes from, so the section never hides a workload that history has."""
    from kdengine.bench import peers  # imports torch: only when records are rendered, never for the gate

    lines = ["# asv results: newest recorded run per machine (generated by `python -m ci record`; do not edit).",
             "# tok/s = tree tokens verified per second of one verify call (T / time).", ""]
    for machine, runs in sorted(runs_by_machine.items()):
        with_rows = [(r, report.verify_rows(r)) for r in runs]
        with_rows = [(r, rows) for r, rows in with_rows if rows]
        if not with_rows:
            continue
        at = max((i for i, (r, _) in enumerate(with_rows) if r.branch), default=len(with_rows) - 1)
        run, rows = with_rows[at]
        gpu = run.fingerprint.get("gpu") or run.fingerprint.get("cpu") or "?"
        lines += [f"## {machine}", f"gpu: {gpu}  commit: {run.commit[:12]}  date: {_date(run)}",
                  f"{'ctx':>6} {'T':>4}  {'backend':<14} {'time':>12} {'tok/s':>12} {'vs extend':>9} {'nsplit':>6}"]
        lines += [_verify_line(r) for r in rows]
        shown = {r["name"] for r in rows}
        older = []  # (row, its run): the newest value of each workload that run left out
        for past, past_rows in reversed(with_rows[:at] + with_rows[at + 1:]):
            for r in past_rows:
                if r["name"] not in shown:
                    shown.add(r["name"])
                    older.append((r, past))
        if older:
            lines.append(f"not in that run ({len(older)} workloads): their newest values, from other runs")
            older.sort(key=lambda x: (x[0]["ctx"], x[0]["T"], x[0]["backend"]))
            lines += [_verify_line(r, f"  {past.commit[:12]} {_date(past, '%Y-%m-%d')}") for r, past in older]
        newer = with_rows[at + 1:]
        if newer:
            lines.append("newer runs off the tracked branch: " + ", ".join(
                f"{r.commit[:12]} {_date(r, '%Y-%m-%d')} ({len(rows_)} workloads)" for r, rows_ in newer))
        lines += peers.ratio_lines({n: p.value for n, p in run.points.items() if p.unit == "seconds"})
        lines.append("")
    return "\n".join(lines)


def kernel_section(results_dir: Path) -> str:
    """The kernel harness's own records (perf_history/kernel/*.json, rendered by
    kdengine.bench.kernel.render_doc), so regenerating the file never drops them."""
    paths = sorted((results_dir / "kernel").glob("*.json"))
    if not paths:
        return ""
    try:
        from kdengine.bench.kernel import render_doc
    except ImportError as exc:
        print(f"[record] kdengine.bench.kernel unavailable ({exc}): kernel section left out")
        return ""
    docs = sorted((history.read_json(p) for p in paths), key=lambda d: d.get("date", ""))
    return ("# kernel harness: `python -m kdengine.bench.kernel` results in perf_history/kernel/*.json\n"
            + "\n\n".join(render_doc(d) for d in docs) + "\n\n")


def write_records(results_dir: Path) -> list[Path]:
    """Regenerate records/*.txt from results_dir as it is (one journaled file)."""
    results_dir = Path(results_dir)
    check_destination(results_dir, RECORDS_REL)
    install(results_dir, {RECORDS_REL: render_records(results_dir, {})}, new_batch_id(), None)
    finish(results_dir)
    return [results_dir / RECORDS_REL]


# --- git -----------------------------------------------------------------------------------------------


def new_batch_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(4)


def repo_root(repo) -> Path:
    return Path(repo.working_tree_dir).resolve()


@contextlib.contextmanager
def record_lock(repo):
    """One record at a time per checkout (an flock in the git dir, released by the kernel on a kill)."""
    with open(Path(repo.git_dir) / "kdengine-record.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def remove_stale_locks(repo) -> list[str]:
    """Remove the git lock files a killed record left. Call with the record lock held (this checkout is
    written only by record while it holds the lock)."""
    done = []
    git_dir = Path(repo.git_dir)
    for lock in [*(git_dir / n for n in GIT_LOCKS), *(git_dir / "refs").rglob("*.lock")]:
        if lock.exists():
            lock.unlink()
            done.append(f"removed stale {lock.relative_to(git_dir)}")
    return done


def abort_rebase(repo) -> list[str]:
    """Abort a rebase a killed record left, then refuse a detached HEAD. Untracked files at paths of the
    commits being rebased are what the killed checkout half-wrote (git refuses to start a rebase over such
    files): they are removed first so the abort can restore the branch."""
    git_dir = Path(repo.git_dir)
    state = next((git_dir / d for d in ("rebase-merge", "rebase-apply") if (git_dir / d).is_dir()), None)
    done = []
    if state is not None:
        tips = [(state / n).read_text().strip() for n in ("onto", "orig-head") if (state / n).exists()]
        tracked = {p for tip in tips for p in repo.git.ls_tree("-r", "--name-only", tip).splitlines()}
        for rel in set(repo.git.ls_files("--others", "--exclude-standard").splitlines()) & tracked:
            (repo_root(repo) / rel).unlink()
            done.append(f"removed {rel}, half-written by the interrupted rebase")
        repo.git.rebase("--abort")
        done.append("aborted a rebase left by an interrupted record")
    if repo.head.is_detached:
        raise RuntimeError(f"{repo_root(repo)}: HEAD is detached and no rebase is in progress; record commits "
                           "on a branch: check out the branch first")
    return done


def recover_repo(repo, results_dir: Path) -> list[str]:
    """Everything a killed record can leave, in order: git locks, an unfinished install (its journal), a
    rebase in progress."""
    return remove_stale_locks(repo) + recover_install(results_dir, repo) + abort_rebase(repo)


def commit(repo, paths: list[Path], message: str) -> bool:
    rel = [str(Path(p).resolve().relative_to(repo_root(repo))) for p in paths]
    repo.git.add("--", *rel)
    if not repo.git.diff("--cached", "--name-only", "--", *rel):
        return False
    repo.git.commit("-m", message, "--", *rel)
    return True


def resolve_rebase(repo, results_dir: Path) -> None:
    """Finish a rebase stopped on conflicts: records are regenerated from the merged results; any other
    conflicting file (machine.json, benchmarks.json, one commit's asv result file) keeps the version being
    replayed, this run's (asv: the newer run's file wins; the sidecars of both runs are distinct files)."""
    while True:
        conflicted = {line.split("\t")[-1] for line in repo.git.diff("--name-only", "--diff-filter=U").splitlines()}
        if not conflicted:
            return
        for rel in sorted(conflicted):
            if not rel.endswith(RECORDS_REL):
                repo.git.checkout("--theirs", "--", rel)
                repo.git.add("--", rel)
                if rel.endswith(".json") and not rel.endswith(("machine.json", "benchmarks.json")):
                    print(f"[record] {rel}: another run of this commit landed first; this run's asv file "
                          "replaces it (asv keeps one per commit and environment), both runs' samples stay")
        for path in write_records(results_dir):
            repo.git.add("--", str(path.resolve().relative_to(repo_root(repo))))
        try:
            repo.git.rebase("--continue", env={"GIT_EDITOR": "true"})
            return
        except Exception:  # noqa: BLE001 - a later commit of the rebase conflicted too: resolve it
            continue


def refresh_records(repo, results_dir: Path) -> bool:
    """After a rebase without conflicts, records may miss the runs fetched: regenerate and commit them."""
    writes = {RECORDS_REL: render_records(results_dir, {})}
    if (results_dir / RECORDS_REL).exists() and (results_dir / RECORDS_REL).read_bytes() == writes[RECORDS_REL]:
        return False
    batch = new_batch_id()
    install(results_dir, writes, batch, repo.head.commit.hexsha)
    made = commit(repo, [results_dir / RECORDS_REL], f"perf_history: regenerate records {SKIP_MARK}\n\n"
                                                     f"{BATCH_TRAILER} {batch}")
    finish(results_dir)
    return made


def push_with_retry(repo, remote: str, branch: str, results_dir: Path, attempts: int = 8) -> int:
    """Push HEAD to remote/branch; on rejection fetch, rebase (regenerating records) and retry. Never forced."""
    import git

    for attempt in range(1, attempts + 1):
        try:
            repo.git.push(remote, f"HEAD:refs/heads/{branch}")
            return attempt
        except git.GitCommandError as exc:
            print(f"[record] push rejected (attempt {attempt}): {str(exc.stderr).strip()[:200]}")
        repo.git.fetch(remote, branch)
        try:
            repo.git.rebase("--autostash", f"{remote}/{branch}")
        except git.GitCommandError:
            resolve_rebase(repo, results_dir)
        refresh_records(repo, results_dir)
        time.sleep(0.2 * attempt + 0.3 * secrets.randbelow(100) / 100)
    raise RuntimeError(f"push to {remote}/{branch} failed after {attempts} attempts")


# --- the command ---------------------------------------------------------------------------------------


def install_results(src: Path, results_dir: Path) -> list[Path]:
    """Install the result files of src (same layout) into results_dir, all or nothing, without a commit;
    returns the paths written (files already present byte for byte are not rewritten)."""
    results_dir = Path(results_dir)
    recover_install(results_dir)
    writes, _, _ = plan(read_batch(Path(src), results_dir), results_dir)
    if writes:
        install(results_dir, writes, new_batch_id(), None)
        finish(results_dir)
    return [results_dir / rel for rel in sorted(writes)]


def commit_message(batch: dict[str, tuple[str, bytes]], message: str | None, batch_id: str) -> str:
    commits = sorted({json.loads(raw).get("commit_hash") or json.loads(raw).get("commit") or ""
                      for kind, raw in batch.values() if kind in ("result", "sidecar")} - {""})
    msg = message or f"perf_history: record {', '.join(c[:10] for c in commits) or 'results'}"
    if SKIP_MARK not in msg:
        msg += f" {SKIP_MARK}"
    return f"{msg}\n\n{BATCH_TRAILER} {batch_id}"


def record(src: Path, results_dir: Path, repo_dir: Path | None, push: bool, remote: str, branch: str,
           message: str | None = None) -> dict:
    """Install, regenerate records, commit and push (see the module docstring). Returns what happened:
    written, replaced (asv files of another run of the same commit), unchanged, committed, push_attempts,
    recovered (what an earlier crash left and this call repaired)."""
    results_dir = Path(results_dir)
    if repo_dir is None:
        return record_files(src, results_dir, None, None, message)
    import git

    repo = git.Repo(repo_dir)
    with record_lock(repo):
        recovered = recover_repo(repo, results_dir)
        out = record_files(src, results_dir, repo, recovered, message)
        if push:
            out["push_attempts"] = push_with_retry(repo, remote, branch, results_dir)
    return out


def record_files(src: Path, results_dir: Path, repo, recovered: list[str] | None, message: str | None) -> dict:
    recovered = recovered if recovered is not None else recover_install(results_dir)
    batch = read_batch(Path(src), results_dir)
    writes, replaced, same = plan(batch, results_dir)
    writes[RECORDS_REL] = render_records(results_dir, writes)
    check_destination(results_dir, RECORDS_REL)
    batch_id = new_batch_id()
    install(results_dir, writes, batch_id, repo.head.commit.hexsha if repo is not None else None)
    out = {"written": [str(results_dir / r) for r in sorted(writes)], "replaced": replaced, "unchanged": same,
           "committed": False, "push_attempts": 0, "recovered": recovered, "batch": batch_id}
    if repo is not None:
        try:
            out["committed"] = commit(repo, [results_dir / r for r in [*writes, *same]],
                                      commit_message(batch, message, batch_id))
        except BaseException:
            recover_install(results_dir, repo)  # a failed commit leaves the old state, as a crash would
            raise
    finish(results_dir)
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("record", help="install new results into perf_history, regenerate records, commit")
    p.add_argument("--from", dest="src", help="directory with the new results (same layout)")
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--repo", default=".", help="git repository to commit in ('' = do not commit)")
    p.add_argument("--push", action="store_true", help="push with fetch-rebase-retry (never force)")
    p.add_argument("--remote", default="origin")
    p.add_argument("--branch", default="main", help="branch to push the results to")
    p.add_argument("--message", default=None)
    p.add_argument("--recover", action="store_true", help="only repair what a killed record left")
    p.add_argument("--export", metavar="DIR", help="copy the checkout's uncommitted result files to DIR "
                                                   "(a batch for `record --from DIR` elsewhere)")
    p.set_defaults(func=main)


def recover(results_dir: Path, repo_dir: Path | None) -> list[str]:
    """Repair what a killed record left (rebase, git locks, a half-installed batch) without recording."""
    if repo_dir is None:
        return recover_install(Path(results_dir))
    import git

    repo = git.Repo(repo_dir)
    with record_lock(repo):
        return recover_repo(repo, Path(results_dir))


def export_changes(results_dir: Path, repo_dir: Path, dest: Path) -> list[Path]:
    """Copy the result files of results_dir that the checkout has not committed (new or modified) into dest,
    same layout: the batch a GPU job hands to the job that records it (`record --from dest`)."""
    import git

    repo = git.Repo(repo_dir)
    results_dir = Path(results_dir).resolve()
    listed = repo.git.ls_files("--modified", "--others", "--exclude-standard", "--",
                               str(results_dir.relative_to(repo_root(repo)))).splitlines()
    written, machines = [], machines_in(results_dir)
    for line in sorted(set(listed)):
        rel = (repo_root(repo) / line).relative_to(results_dir)
        if rel.suffix != ".json" or classify(rel, machines)[0] == "" or rel.parts[0].startswith("."):
            continue
        source = results_dir / rel
        raw = source.read_bytes()
        validate(source, rel, raw, machines)
        (Path(dest) / rel).parent.mkdir(parents=True, exist_ok=True)
        (Path(dest) / rel).write_bytes(raw)
        written.append(Path(dest) / rel)
    return written


def main(args) -> int:
    repo_dir = Path(args.repo) if args.repo else None
    if args.export:
        if repo_dir is None:
            raise ValueError("--export: needs --repo (the checkout whose uncommitted results are exported)")
        written = export_changes(Path(args.results_dir), repo_dir, Path(args.export))
        print(f"[record] exported {len(written)} uncommitted result files to {args.export}")
        return 0
    if args.recover:
        for line in recover(Path(args.results_dir), repo_dir) or ["nothing to repair"]:
            print(f"[record] {line}")
        return 0
    if not args.src:
        raise ValueError("--from: required (or --recover)")
    out = record(Path(args.src), Path(args.results_dir), repo_dir, args.push, args.remote, args.branch,
                 args.message)
    for line in out["recovered"]:
        print(f"[record] recovered: {line}")
    for rel in out["replaced"]:
        print(f"[record] {rel} replaces the asv result of an earlier run of this commit (asv keeps one file per "
              "commit and environment); both runs' samples stay in samples/<machine>/")
    print(f"[record] wrote {len(out['written'])} files ({len(out['unchanged'])} already present); "
          f"committed: {out['committed']}; push attempts: {out['push_attempts']}")
    return 0
