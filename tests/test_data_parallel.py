"""One run trained on every rank (`--parallel data`, DistributedDataParallel; `--parallel
fsdp`, FSDP2) under torchrun with 2 CPU processes (gloo): the loss curve equals one process's on
the same global batch, a run stopped on 2 ranks resumes on 1 to the same losses as an
uninterrupted run, and `posenc extrapolate --parallel data|fsdp` gives one process's results
with records written once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch.distributed.run")

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

#: Trains a tiny LM with posenc's train_lm; argv: out.json checkpoint.pt steps stop_after mode.
#: Rank 0 writes the losses. stop_after < steps ends the process after that step (a kill
#: after the checkpoint written at that step).
SCRIPT = textwrap.dedent('''
    import json, os, sys
    import torch
    import posenc
    from posenc.lab.experiments import distributed
    from posenc.lab.model import LMConfig, TransformerLM
    from posenc.lab.train import IGNORE_INDEX, TrainConfig, train_lm

    out, ckpt, steps, stop_after, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    distributed.init_from_env("cpu", mode)
    torch.manual_seed(0)
    config = LMConfig(vocab_size=32, d_model=16, num_layers=2, num_heads=2, max_positions=64)
    model = TransformerLM(config, posenc.create_for_model("t5", **config.encoding_sizes()))

    def batches(batch_size, generator):
        # rows with different numbers of targets: the global mean must weigh them as one process does
        tokens = torch.randint(0, 32, (batch_size, 12), generator=generator)
        targets = tokens.roll(-1, 1)
        for row in range(batch_size):
            targets[row, : row % 5] = IGNORE_INDEX
        return tokens, targets

    class Stop(Exception):
        pass

    def on_step(step, loss):
        if step + 1 == stop_after:
            raise Stop

    train = TrainConfig(steps=steps, batch_size=6, seq_len=12, lr=3e-3, seed=0)
    try:
        losses = train_lm(model, batches, train, on_step, checkpoint_path=ckpt if ckpt != "-" else None,
                          checkpoint_every=3)
    except Stop:  # as a kill would: no orderly shutdown of the process group (its threads may abort the exit)
        os._exit(0)
    if distributed.current().is_main:
        with open(out, "w") as handle:
            json.dump(losses, handle)
''')


def run(tmp_path, name, ranks, steps=6, stop_after=0, ckpt="-", mode="data"):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{name}.json"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] \
        if ranks > 1 else [sys.executable]
    proc = subprocess.run([*launcher, str(script), str(out), str(ckpt), str(steps), str(stop_after), mode],
                          env=ENV, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()) if out.exists() else None


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The losses of the uninterrupted run in one process: the reference of every test here, run
    once for the module (a few seconds a process start)."""
    return run(tmp_path_factory.mktemp("one_process"), "one", 1)


@pytest.mark.parametrize("mode", ["data", "fsdp"])
def test_two_ranks_give_one_process_loss_curve(tmp_path, mode, one_process):
    one = one_process
    two = run(tmp_path, "two", 2, mode=mode)
    assert len(one) == len(two) == 6
    # float32 sums split over two ranks: rounding differences only; a wrong weighting of the
    # rows (a per-rank mean) or a wrong slice moves the first loss already by > 1e-2
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-5, (one, two)
    assert one[-1] < one[0]


@pytest.mark.parametrize("mode", ["data", pytest.param("fsdp", marks=pytest.mark.slow)])  # fsdp: -m slow (time budget)
def test_a_run_stopped_on_two_ranks_resumes_on_one(tmp_path, mode, one_process):
    whole = one_process
    ckpt = tmp_path / "run.pt"
    assert run(tmp_path, "first", 2, stop_after=4, ckpt=ckpt, mode=mode) is None  # checkpoint of step 3
    resumed = run(tmp_path, "resumed", 1, ckpt=ckpt)
    assert len(resumed) == 6
    assert max(abs(a - b) for a, b in zip(whole, resumed)) < 1e-5, (whole, resumed)


@pytest.mark.slow  # 13 s (two launches); the default run keeps the ranks' loss curves and the resume
@pytest.mark.parametrize("mode", ["data", "fsdp"])
def test_extrapolate_on_every_rank_equals_one_process(tmp_path, mode):
    corpus = tmp_path / "text.txt"
    corpus.write_text("".join(f"row {i}: x{i % 11} = {i * 3 % 97}\n" for i in range(300)))
    args = ["extrapolate", "--encodings", "nope,alibi", "--seeds", "0", "--train-len", "8", "--steps", "4",
            "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2", "--eval-factors", "1,2",
            "--eval-tokens", "32", "--corpus", str(corpus)]
    results = {}
    for name, launcher in (("one", [sys.executable]),
                           ("two", [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"])):
        out = tmp_path / name
        proc = subprocess.run([*launcher, "-m", "posenc.lab.cli", *args, "--parallel", mode, "--out", str(out)],
                              env=ENV, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads((out / "results.json").read_text())["results"]
        assert sorted(p.name for p in (out / "runs").glob("*.json")) == ["alibi-seed0.json", "nope-seed0.json"]
    for encoding in ("nope", "alibi"):
        for length, cell in results["one"][encoding]["eval"].items():
            assert cell["loss"] == pytest.approx(results["two"][encoding]["eval"][length]["loss"], abs=1e-5)


def test_parallel_must_be_a_mode(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "posenc.lab.cli", "extrapolate", "--parallel", "model",
                           "--out", str(tmp_path / "o")], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--parallel must be one of runs, data, fsdp" in proc.stderr
