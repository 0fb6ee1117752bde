"""Runs that survive: `posenc extrapolate` killed with SIGKILL mid-training and rerun with the
same arguments resumes; nothing finished is retrained; the result is the uninterrupted one's.
A corrupt or mismatched checkpoint or run record is a one-line error with exit code 2."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from posenc.lab.cli import main

ARGS = ["--encodings", "nope,rope", "--train-len", "8", "--steps", "150", "--batch-size", "4", "--d-model", "16",
        "--layers", "1", "--heads", "2", "--eval-factors", "1,2", "--eval-tokens", "64", "--seeds", "3"]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("".join(f"line {i}: the value of x{i % 13} is {i * 7 % 101}\n" for i in range(400)))
    return path


def command(corpus, out):
    return [sys.executable, "-m", "posenc.lab.cli", "extrapolate", *ARGS, "--corpus", str(corpus), "--out", str(out)]


def environment():
    # checkpoint every 5 steps so that the kill lands between two checkpoints; one thread
    # for every process, so float reductions run in one order in all three runs.
    return {**os.environ, "POSENC_CHECKPOINT_EVERY": "5", "OMP_NUM_THREADS": "1"}


# 35 s of three 150-step CLI runs: behind slow (the default suite's time budget; pytest -m slow). By
# default, test_data_parallel's stopped run resumes from its checkpoint to the uninterrupted losses,
# and test_lengthgen's rerun finds its records "already done"
@pytest.mark.slow
def test_sigkill_mid_training_then_rerun_resumes_to_the_same_results(tmp_path, corpus_file):
    # the uninterrupted reference runs alongside (two cores)
    reference = subprocess.Popen(command(corpus_file, tmp_path / "ref"), env=environment(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = tmp_path / "out"
    proc = subprocess.Popen(command(corpus_file, out), env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finished, checkpoint = out / "runs" / "nope-seed3.json", out / "checkpoints" / "rope-seed3.pt"
    deadline = time.monotonic() + 60
    while not (finished.exists() and checkpoint.exists()):  # nope done, rope training
        assert proc.poll() is None, "the run ended before it could be killed mid-training"
        assert time.monotonic() < deadline
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "runs" / "rope-seed3.json").exists() and not (out / "results.json").exists()
    step = torch.load(checkpoint, weights_only=True)["step"]
    assert 0 < step < 150
    before = (finished.read_bytes(), finished.stat().st_mtime_ns)

    resumed = subprocess.run(command(corpus_file, out), env=environment(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "nope seed 3 (already done)" in resumed.stdout
    assert "resumed at step" in resumed.stdout  # rope continued from its checkpoint
    assert (finished.read_bytes(), finished.stat().st_mtime_ns) == before  # not retrained, not rewritten
    assert reference.wait() == 0, reference.stderr.read()
    assert (out / "results.json").read_bytes() == (tmp_path / "ref" / "results.json").read_bytes()
    assert (out / "results.csv").read_bytes() == (tmp_path / "ref" / "results.csv").read_bytes()


TINY = ["--encodings", "nope", "--train-len", "8", "--steps", "6", "--batch-size", "2", "--d-model", "16",
        "--layers", "1", "--heads", "2", "--eval-factors", "1", "--eval-tokens", "16", "--seeds", "0"]


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.err


def one_line_error(code, err, *needles):
    assert code == 2 and err.startswith("posenc: error:") and err.count("\n") == 1, err
    assert all(n in err for n in needles), err


def test_corrupt_checkpoint_is_an_error_not_a_restart(tmp_path, corpus_file, capsys):
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "nope-seed0.pt").write_bytes(b"not a checkpoint")
    code, err = run_cli(["extrapolate", *TINY, "--corpus", str(corpus_file), "--out", str(out)], capsys)
    one_line_error(code, err, "nope-seed0.pt", "corrupt")


@pytest.fixture(scope="module")
def finished_out(tmp_path_factory, corpus_file):
    """A finished tiny sweep: runs/nope-seed0.json and its final checkpoint."""
    out = tmp_path_factory.mktemp("finished")
    assert main(["extrapolate", *TINY, "--corpus", str(corpus_file), "--out", str(out)]) == 0
    return out


def damaged_copy(finished_out, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished_out, out)
    return out


def test_checkpoint_from_other_arguments_is_an_error(finished_out, tmp_path, corpus_file, capsys):
    out = damaged_copy(finished_out, tmp_path)
    (out / "runs" / "nope-seed0.json").unlink()  # only the checkpoint, made with --steps 6, is left
    args = [a if a != "6" else "8" for a in TINY]  # --steps 8
    code, err = run_cli(["extrapolate", *args, "--corpus", str(corpus_file), "--out", str(out)], capsys)
    one_line_error(code, err, "nope-seed0.pt", "other arguments")


@pytest.mark.parametrize("damage", ["truncated", "other version", "other arguments"])
def test_bad_run_record_is_an_error(damage, finished_out, tmp_path, corpus_file, capsys):
    out = damaged_copy(finished_out, tmp_path)
    record_path = out / "runs" / "nope-seed0.json"
    record = json.loads(record_path.read_text())
    if damage == "truncated":
        record_path.write_text(record_path.read_text()[:50])
    elif damage == "other version":
        record["fingerprint"]["posenc_version"] = "0.0.1"
        record_path.write_text(json.dumps(record))
    else:
        record["fingerprint"]["train"]["lr"] = 0.5
        record_path.write_text(json.dumps(record))
    code, err = run_cli(["extrapolate", *TINY, "--corpus", str(corpus_file), "--out", str(out)], capsys)
    one_line_error(code, err, "nope-seed0.json", "corrupt" if damage == "truncated" else "other arguments or another posenc version")


@pytest.mark.parametrize("loss", ["0.5", float("nan"), None])
def test_a_run_record_whose_loss_is_not_a_number_is_corrupt(loss, finished_out, tmp_path, corpus_file, capsys):
    """A hand-edited record (loss a string, NaN, or missing) is refused as a corrupt record naming
    its file and field, exit 2: not an internal TypeError in the merge, not an --out problem."""
    out = damaged_copy(finished_out, tmp_path)
    record_path = out / "runs" / "nope-seed0.json"
    record = json.loads(record_path.read_text())
    cell = record["eval"]["8"]
    if loss is None:
        del cell["loss"]
    else:
        cell["loss"] = loss
    record_path.write_text(json.dumps(record))  # NaN as the bare token json writes
    code, err = run_cli(["extrapolate", *TINY, "--corpus", str(corpus_file), "--out", str(out)], capsys)
    one_line_error(code, err, "nope-seed0.json", "corrupt run record", "eval.8.loss")
    assert not err.startswith("posenc: error: --out")
