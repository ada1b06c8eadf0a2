"""`kdengine bench`: filter, table, --json sidecar, bad arguments."""

from __future__ import annotations

import json

import torch

from kdengine.cli import main


def test_bench_filter_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KDENGINE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KDENGINE_SAMPLES_OUT", raising=False)
    out = tmp_path / "bench.json"
    pattern = "cpu-verify/reference/ctx512/T4" if not torch.cuda.is_available() else "verify/reference/ctx4096/T16"
    assert main(["bench", "--filter", pattern, "--samples", "3", "--json", str(out)]) == 0
    assert "kdengine bench" in capsys.readouterr().out
    data = json.loads(out.read_text())
    from kdengine.bench import samples

    assert data["schema"] == samples.SCHEMA and list(data["results"]) == [pattern]
    assert len(data["results"][pattern]["samples"]) == (3 if not torch.cuda.is_available() else 20)


def test_bench_list_and_bad_arguments(capsys):
    assert main(["bench", "--all", "--list", "--filter", "^decode/"]) == 0
    assert capsys.readouterr().out.split() == [f"decode/{b}/ctx{n}" for b in ("triton_extend", "triton", "cuda")
                                               for n in (4096, 16384, 65536)]
    assert main(["bench", "--filter", "("]) == 2
    assert "--filter" in capsys.readouterr().err
    assert main(["bench", "--filter", "no-such-workload"]) == 2
    assert main(["bench", "--samples", "0"]) == 2


def test_peer_ratio_lines_from_a_run():
    from kdengine.bench.cli import peer_ratio_lines

    records = [{"name": "verify/cuda/ctx4096/T16", "unit": "seconds", "median": 27e-6},
               {"name": "verify-peer/flashmla/ctx4096/T16", "unit": "seconds", "median": 24e-6},
               {"name": "decode/cuda/ctx4096", "unit": "tok/s", "median": 900.0}]
    lines = peer_ratio_lines(records)
    assert lines[0].startswith("ours / peer") and "1.12x" in lines[-1]
    assert peer_ratio_lines(records[:1]) == []
