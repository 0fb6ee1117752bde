"""`posenc extrapolate` under torchrun with 2 CPU processes (gloo): the (encoding, seed) runs
are split across the ranks, each writes its own run records, rank 0 merges and reports."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch.distributed.run")


def test_torchrun_two_processes_split_the_runs_and_rank0_merges(tmp_path):
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(f"row {i}: x{i % 11} = {i * 3 % 97}\n" for i in range(300)))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "posenc.lab.cli", "extrapolate", "--encodings", "nope,alibi,rope", "--seeds", "0,1",
           "--train-len", "8", "--steps", "3", "--batch-size", "2", "--d-model", "16", "--layers", "1",
           "--heads", "2", "--eval-factors", "1,2", "--eval-tokens", "32", "--corpus", str(corpus), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "results.json").read_text())
    assert set(summary["results"]) == {"nope", "alibi", "rope"}
    for res in summary["results"].values():
        assert set(res["runs"]) == {"0", "1"} and all(cell["seeds"] == 2 for cell in res["eval"].values())
    assert sorted(p.name for p in (out / "runs").glob("*.json")) == sorted(
        f"{e}-seed{s}.json" for e in ("nope", "alibi", "rope") for s in (0, 1))
    assert (out / "results.csv").exists() and (out / "extrapolation.png").exists()
    # rank 0 alone reports: one corpus line, one table, runs of both ranks seen by the merge
    assert proc.stdout.count("corpus") == 1 and proc.stdout.count("validation loss, bits per byte") == 1
    assert proc.stdout.count("seed 0") + proc.stdout.count("seed 1") == 3  # rank 0's share: 3 of 6 runs
