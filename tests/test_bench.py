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


def test_rope_device_benchmark_harness_on_cpu(tmp_path):
    """The accelerator comparison's harness at tiny sizes on the CPU: every mode, the copy as
    the ratio's base, the forward checked against float64, the table written to a file."""
    rows, notes = bench.rope_device_benchmark(
        "cpu", lengths=(16,), q_heads=2, kv_heads=1, head_dim=8, repeats=1, compile_peers=False)
    modes = {(row["mode"], row["method"]) for row in rows}
    assert ("forward", bench.COPY_FLOOR) in modes and ("forward+backward", "posenc RoPE.rotate") in modes
    for row in rows:
        if row["method"] == bench.COPY_FLOOR:
            assert row["vs_copy"] == 1.0
        if row["mode"] == "forward" and row["method"] != bench.COPY_FLOOR:
            assert row["max_err"] < 0.05  # bf16 rounding of values of a few units
    assert any("Liger and flash-attn run on CUDA only" in note for note in notes)
    bench.write_table(tmp_path / "rope.md", "t", rows, bench.ROPE_DEVICE_COLUMNS, notes)
    assert "| 16 | forward | copy q, k" in (tmp_path / "rope.md").read_text()
    assert (tmp_path / "rope.json").exists()
