"""End to end: `posenc extrapolate` on a tiny corpus and model; bad arguments exit 2 in one line."""

import csv
import json
import subprocess
import sys

import pytest

import posenc
from posenc.lab.cli import main
from posenc.lab.data import load_corpus
from posenc.lab.experiments.extrapolation import preset_config, run_extrapolation

TINY = ["--train-len", "8", "--steps", "4", "--batch-size", "4", "--d-model", "16", "--layers", "1",
        "--heads", "2", "--eval-factors", "1,2,4", "--eval-tokens", "128"]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for i in range(40):
        (root / f"f{i}.py").write_text(f"def function_{i}(x):\n    return x * {i} + {i % 7}\n" * 8)
    return root


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_extrapolate_end_to_end(tmp_path, corpus_dir, capsys):
    out = tmp_path / "out"
    names = "nope,sinusoidal,learned,rope,alibi,t5"
    code, stdout, err = run_cli(["extrapolate", "--encodings", names, "--corpus", str(corpus_dir), "--out", str(out), "--seeds", "0,1", *TINY], capsys)
    assert code == 0, err
    assert "40 files" in stdout and "bits per byte" in stdout
    summary = json.loads((out / "results.json").read_text())
    assert set(summary["results"]) == set(names.split(","))
    assert summary["config"]["eval_lengths"] == [8, 16, 32]
    for name, res in summary["results"].items():
        assert res["train_len"] == 8
        assert set(res["eval"]) == {"8", "16", "32"}
        for cell in res["eval"].values():
            assert 0 < cell["loss"] < 10 and cell["ppl"] == pytest.approx(2.718281828 ** cell["loss"], rel=1e-6)
            assert cell["seeds"] == 2
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 6 * 3 and {r["encoding"] for r in rows} == set(names.split(","))
    png = (out / "extrapolation.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert len(list((out / "runs").glob("*.json"))) == 12

    # Rerunning with the same arguments reuses every finished run and gives the same file.
    code, stdout, _ = run_cli(["extrapolate", "--encodings", names, "--corpus", str(corpus_dir), "--out", str(out), "--seeds", "0,1", *TINY], capsys)
    assert code == 0 and stdout.count("already done") == 12
    assert json.loads((out / "results.json").read_text())["results"] == summary["results"]

    # Other arguments on the same folder: a clear error, never a silent restart.
    code, _, err = run_cli(["extrapolate", "--encodings", "nope", "--corpus", str(corpus_dir), "--out", str(out), *TINY[:-2], "--eval-tokens", "96"], capsys)
    assert code == 2 and "other arguments" in err and err.count("\n") == 1


def test_learned_table_past_its_length_is_not_applicable(tmp_path, corpus_dir):
    config = preset_config("quick", encodings=("learned", "rope"), train_len=8, steps=3, batch_size=2, d_model=16,
                           num_layers=1, num_heads=2, eval_factors=(1, 2, 4), eval_tokens=64, learned_positions=16)
    summary = run_extrapolation(config, load_corpus(corpus_dir), tmp_path)
    learned = summary["results"]["learned"]
    assert set(learned["eval"]) == {"8", "16"} and "32" in learned["not_applicable"]
    assert set(summary["results"]["rope"]["eval"]) == {"8", "16", "32"}


@pytest.mark.parametrize("args, match", [
    (["extrapolate", "--encodings", "nope,rotary"], "unknown encoding 'rotary'; available: nope"),
    (["extrapolate", "--corpus", "/no/such/path"], "does not exist"),
    (["extrapolate", "--steps", "0"], "steps must be an integer >= 1"),
    (["extrapolate", "--batch-size", "-3"], "batch_size must be an integer >= 1"),
    (["extrapolate", "--eval-factors", "1,0.5"], "--eval-factors"),
    (["extrapolate", "--eval-factors", "0,1"], "no evaluation shorter than L"),
    (["extrapolate", "--preset", "huge"], "preset must be one of"),
    (["extrapolate", "--heads", "3"], "divisible"),
    (["extrapolate", "--steps", "many"], "--steps"),
    (["frobnicate"], "frobnicate"),
])
def test_bad_arguments_print_one_line_and_exit_2(args, match, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert err.startswith("posenc: error:") and err.count("\n") == 1 and match in err, err


def test_console_script_exit_code_and_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "posenc.lab.cli", "extrapolate", "--encodings", "bogus"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"posenc: error: unknown encoding 'bogus'; available: {', '.join(posenc.available())}"


def test_list(capsys):
    code, stdout, _ = run_cli(["list"], capsys)
    assert code == 0 and all(name in stdout for name in posenc.available())


def _buggy_plot(name, out):
    return None + 1  # a bug, not a refused argument


@pytest.mark.parametrize("debug", [False, True])
def test_an_unexpected_exception_is_an_internal_error_exit_1(monkeypatch, capsys, debug):
    import posenc.lab.plots

    monkeypatch.setattr(posenc.lab.plots, "plot_encoding", _buggy_plot)
    if debug:
        monkeypatch.setenv("POSENC_DEBUG", "1")
        with pytest.raises(TypeError):
            main(["plot", "rope"])
        return
    monkeypatch.delenv("POSENC_DEBUG", raising=False)
    code, _, err = run_cli(["plot", "rope"], capsys)
    assert code == 1
    assert err.startswith("posenc: internal error: TypeError:") and err.count("\n") == 1
    assert "POSENC_DEBUG=1" in err and "posenc: error:" not in err


def test_an_interrupt_exits_130_not_0(monkeypatch, tmp_path, capsys):
    """Ctrl-C during a run: exit status 130 and a line on stderr, so that `posenc extrapolate
    && publish` does not publish (typer hands the code back under standalone_mode=False)."""
    import posenc.lab.experiments.extrapolation as extrapolation

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(extrapolation, "run_extrapolation", interrupted)
    code = main(["extrapolate", "--preset", "quick", "--out", str(tmp_path / "out")])
    assert code == 130
    assert "interrupted" in capsys.readouterr().err


def test_a_run_logged_to_a_file_prints_progress_lines(monkeypatch):
    """Output going to a file (a batch job, CI, nohup) draws no bar: the reporter prints a plain
    line with step, loss, speed and time left now and then, on stderr (issue 22)."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    import posenc.lab.cli as cli

    monkeypatch.setattr(cli, "PLAIN_PROGRESS_SECONDS", 0.0)
    out = io.StringIO()
    monkeypatch.setattr(cli, "log_console", Console(file=out, force_terminal=False))
    reporter = cli.RichReporter(Progress(console=Console(file=io.StringIO(), force_terminal=False)))
    reporter.run_started("rope", 0, 4, 0)
    for step in range(4):
        reporter.train_step(step, 2.0)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("train rope seed 0")]
    assert len(lines) == 4
    assert lines[0].startswith("train rope seed 0: step 1/4, loss 2.885 bpb,") and "left" in lines[0]
    assert lines[-1].startswith("train rope seed 0: step 4/4") and "left" not in lines[-1]
