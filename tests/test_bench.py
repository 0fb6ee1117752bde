"""`posenc bench`: wired to posenc.bench, one-line errors; a smoke run of the RoPE table."""

from __future__ import annotations

from posenc import bench
from posenc.cli import main


def test_bench_rejects_unknown_target(capsys):
    assert main(["bench", "nonsense"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc: error:") and "rope, attention, throughput" in err and "\n" not in err


def test_bench_rope_quick(capsys):
    assert main(["bench", "rope", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "RoPE on q and k" in out and "apply_rotary" in out and "HF-style" in out


def test_rope_rows_are_ratios_to_the_copy():
    rows, _ = bench.rope_benchmark((1, 2, 16, 8), dtypes=("float32",), repeats=1, threads=None)
    by_method = {row["method"]: row for row in rows}
    assert by_method["copy (clone: new tensors)"]["vs_clone"] == 1.0
    assert by_method["copy_ (into preallocated)"]["vs_copy_"] == 1.0
