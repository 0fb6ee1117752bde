"""The run store (posenc.lab.experiments.runs) and ExtrapolationConfig's composition of the model
and training configs, on their own (end to end they are in test_cli, test_resume and
test_rope_extension)."""

import json

import pytest

from posenc.lab.checkpoint import CheckpointMismatch
from posenc.lab.experiments.extrapolation import ExtrapolationConfig, preset_config
from posenc.lab.experiments.runs import Reporter, RunStore
from posenc.lab.model import LMConfig
from posenc.lab.train import TrainConfig


class Seen(Reporter):
    def __init__(self):
        self.finished = []

    def run_finished(self, row, seed, record, skipped):
        self.finished.append((row, seed, skipped))


def test_layout_and_resume(tmp_path):
    store, reporter, calls = RunStore(tmp_path), Seen(), []

    def compute():
        calls.append(1)
        return {"value": 3}

    assert store.record_path("rope+yarn", 2) == tmp_path / "runs" / "rope+yarn-seed2.json"
    assert store.checkpoint_path("rope", 0) == tmp_path / "checkpoints" / "rope-seed0.pt"
    assert store.stored("rope", 0, {"a": 1}) is None
    first = store.run("rope", 0, {"a": 1}, compute, reporter)
    assert first == {"fingerprint": {"a": 1}, "value": 3}
    assert json.loads(store.record_path("rope", 0).read_text()) == first
    assert store.run("rope", 0, {"a": 1}, compute, reporter) == first and len(calls) == 1  # stored, not recomputed
    assert reporter.finished == [("rope", 0, False), ("rope", 0, True)]
    with pytest.raises(CheckpointMismatch, match=r"rope-seed0.json holds a run with other arguments"):
        store.stored("rope", 0, {"a": 2})
    with pytest.raises(ValueError, match="must hold its fingerprint"):
        store.write("nope", 0, {"value": 1})
    assert not store.record_path("nope", 0).exists()


def test_sweep_without_torchrun_runs_every_job_in_order(tmp_path):
    store = RunStore(tmp_path)
    jobs = [("b", 1), ("a", 0), ("a", 1)]
    records = store.sweep(jobs, lambda row, seed: {"row": row}, lambda row, seed, fp: {"row": row, "seed": seed})
    assert [(r["row"], r["seed"]) for r in records] == jobs
    assert all(r["fingerprint"] == {"row": r["row"]} for r in records)


def test_config_composes_model_and_train():
    config = ExtrapolationConfig.from_options(train_len=16, steps=5, lr=1e-3, d_model=32, num_heads=8, eval_factors=(1, 4))
    assert config.train == TrainConfig(steps=5, seq_len=16, lr=1e-3)
    assert config.model == LMConfig(d_model=32, num_heads=8, max_positions=64)  # the longest eval length
    assert config.train_len == 16 and config.eval_lengths == [16, 64]
    assert config.train_config(3) == TrainConfig(steps=5, seq_len=16, lr=1e-3, seed=3)
    assert ExtrapolationConfig.from_options(learned_positions=100).model.max_positions == 100
    # the defaults are LMConfig's and TrainConfig's own
    assert ExtrapolationConfig().train == TrainConfig() and ExtrapolationConfig().model.d_model == LMConfig().d_model
    assert preset_config("quick").model.num_layers == 2 and preset_config("quick").train.steps == 300
    d = config.to_dict()
    assert d["model"]["d_model"] == 32 and d["train"]["seq_len"] == 16 and "seed" not in d["train"]
    assert d["train_len"] == 16 and d["eval_lengths"] == [16, 64] and d["extension_methods"] == ()


def _body_or_fail(row, seed, expected):
    """A sweep job for the worker tests: row "bad" fails, "slow" takes a second."""
    import time

    if row == "bad":
        raise RuntimeError("this run failed")
    if row == "killed":  # the OS kills the worker (out of memory, say)
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if row == "slow":
        time.sleep(1.0)
    return {"value": f"{row}{seed}"}


def test_sweep_in_worker_processes(tmp_path):
    store = RunStore(tmp_path)
    jobs = [("a", 0), ("b", 0), ("a", 1)]
    store.write("b", 0, {"fingerprint": {"row": "b"}, "value": "stored"})
    finished = []

    class Seen(Reporter):
        def run_finished(self, row, seed, record, skipped):
            finished.append((row, seed, skipped))

    records = store.sweep(jobs, lambda row, seed: {"row": row}, _body_or_fail, Seen(), workers=2)
    assert [r["value"] for r in records] == ["a0", "stored", "a1"]  # in jobs order, the stored one reused
    assert sorted(finished) == [("a", 0, False), ("a", 1, False), ("b", 0, True)]
    assert json.loads(store.record_path("a", 1).read_text()) == {"fingerprint": {"row": "a"}, "value": "a1"}


def test_a_failed_worker_run_keeps_the_finished_ones(tmp_path):
    store = RunStore(tmp_path)
    with pytest.raises(RuntimeError, match="this run failed"):
        store.sweep([("slow", 0), ("bad", 0)], lambda row, seed: {"row": row}, _body_or_fail, workers=2)
    assert store.stored("slow", 0, {"row": "slow"})["value"] == "slow0"  # running when "bad" failed: kept
    assert not store.record_path("bad", 0).exists()
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        store.sweep([("a", 0)], lambda row, seed: {}, _body_or_fail, workers=0)


def test_a_record_holding_nan_is_refused_not_reused(tmp_path):
    """A diverged run's record (bare NaN tokens, which json reads) is not a finished run."""
    store = RunStore(tmp_path)
    path = store.record_path("rope", 0)
    path.parent.mkdir(parents=True)
    path.write_text('{"fingerprint": {"a": 1}, "eval": {"64": {"loss": NaN}}}')
    with pytest.raises(CheckpointMismatch, match="non-finite"):
        store.stored("rope", 0, {"a": 1})


def test_diverged_training_raises_and_stores_nothing(tmp_path):
    """--lr 1e6: the loss turns NaN; training stops with an error naming the step and the
    learning rate (the CLI: exit 2), and no checkpoint holds the diverged weights."""
    import torch

    from posenc.lab.model import TransformerLM
    from posenc.lab.train import TrainingDiverged, train_lm

    model = TransformerLM(LMConfig(d_model=16, num_layers=1, num_heads=2, max_positions=16), "rope")
    data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    config = TrainConfig(steps=40, batch_size=4, seq_len=16, lr=1e6, grad_clip=1e9, warmup_frac=0.0)
    checkpoint = tmp_path / "run.pt"
    with pytest.raises(TrainingDiverged, match=r"diverged at step \d+ of 40.*lr 1000000"):
        train_lm(model, data, config, checkpoint_path=checkpoint, checkpoint_every=1)
    if checkpoint.exists():  # a checkpoint of an earlier, finite step may stay; never a NaN one
        state = torch.load(checkpoint, weights_only=True)
        assert all(torch.isfinite(torch.tensor(state["losses"])))


def test_a_killed_writers_temporaries_are_removed_and_live_ones_kept(tmp_path):
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited
    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / f".rope-seed0.pt.{dead_pid}.tmp"
    live = tmp_path / "checkpoints" / f".nope-seed0.pt.{os.getpid()}.tmp"
    stale.write_bytes(b"x" * 10)
    live.write_bytes(b"x")
    RunStore(tmp_path)
    assert not stale.exists() and live.exists()


def test_results_csv_goes_through_a_temporary_file_of_this_process(tmp_path, monkeypatch):
    """Two writers of one folder raced on a fixed results.csv.tmp (issue 22)."""
    import posenc.lab.checkpoint as checkpoint
    from posenc.lab.experiments.frame import write_csv

    seen = []
    original = checkpoint._atomic
    monkeypatch.setattr(checkpoint, "_atomic", lambda path, write: (seen.append(path), original(path, write)))
    write_csv(tmp_path / "results.csv", ["a", "b"], [[1, 2]])
    assert seen == [tmp_path / "results.csv"]
    assert (tmp_path / "results.csv").read_bytes() == b"a,b\r\n1,2\r\n"


def test_a_resumed_run_is_timed_whole_across_its_legs():
    """Time and throughput cover every leg of a resumed run (the checkpoint keeps the seconds
    of its steps); with a checkpoint that does not (written before), the last leg alone, said
    so. Throughput over every step's tokens but one leg's seconds was up to 3,000x too high."""
    from posenc.lab.experiments.lm import training_fields

    config = TrainConfig(steps=100, batch_size=2, seq_len=8)
    fresh = training_fields(config, [1.0] * 100, 10.0)
    assert fresh["tokens_per_second"] == 100 * 2 * 8 / 10 and "resumed_at_step" not in fresh
    resumed = training_fields(config, [1.0] * 100, 2.0, first_step=90, earlier_seconds=8.0)
    assert resumed["train_seconds"] == 10.0 and resumed["tokens_per_second"] == 100 * 2 * 8 / 10
    assert resumed["resumed_at_step"] == 90 and "timed" not in resumed
    unknown = training_fields(config, [1.0] * 100, 2.0, first_step=90, earlier_seconds=None)
    assert unknown["tokens_per_second"] == 10 * 2 * 8 / 2 and unknown["timed"] == "last leg"


def test_the_checkpoint_keeps_the_seconds_of_its_steps(tmp_path):
    import torch

    from posenc.lab.model import TransformerLM
    from posenc.lab.train import train_lm

    data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    config = TrainConfig(steps=6, batch_size=2, seq_len=8)
    path = tmp_path / "run.pt"

    class Stop(Exception):
        pass

    def stop_after_4(step, loss):
        if step + 1 == 4:
            raise Stop

    model = TransformerLM(LMConfig(d_model=16, num_layers=1, num_heads=2, max_positions=16), "rope")
    with pytest.raises(Stop):
        train_lm(model, data, config, stop_after_4, checkpoint_path=path, checkpoint_every=3)
    stored = torch.load(path, weights_only=True)["train_seconds"]
    assert stored > 0
    timing = {}
    model = TransformerLM(LMConfig(d_model=16, num_layers=1, num_heads=2, max_positions=16), "rope")
    train_lm(model, data, config, checkpoint_path=path, checkpoint_every=3, timing=timing)
    assert timing == {"earlier_seconds": stored}
    assert torch.load(path, weights_only=True)["train_seconds"] > stored  # the final checkpoint: both legs


def test_a_second_run_on_the_same_out_folder_is_refused(tmp_path):
    """Two posenc runs on one --out interleaved their records under each other's tables
    (issue 22): while one holds the folder, another sweep refuses at once, naming the pid."""
    import os

    from posenc.errors import InvalidArgument

    first, second = RunStore(tmp_path), RunStore(tmp_path)
    with first.exclusive():  # another sweep in progress (flock: per open file, so this process counts too)
        with pytest.raises(InvalidArgument, match=rf"in use by another posenc run \(pid {os.getpid()} on .+, since "):
            second.sweep([("rope", 0)], fingerprint=lambda r, s: {"a": 1}, compute=lambda r, s, e: {"v": 1})
        assert not second.record_path("rope", 0).exists()
    assert second.sweep([("rope", 0)], fingerprint=lambda r, s: {"a": 1}, compute=lambda r, s, e: {"v": 1}) == \
        [{"fingerprint": {"a": 1}, "v": 1}]


def test_a_worker_killed_by_the_os_is_reported_as_such_not_as_a_bug(tmp_path):
    from posenc.lab.experiments.runs import RunAborted

    store = RunStore(tmp_path)
    with pytest.raises(RunAborted, match="a worker process died"):
        store.sweep([("killed", 0), ("a", 0)], lambda row, seed: {"row": row}, _body_or_fail, workers=2)
    assert not store.record_path("killed", 0).exists()


PARENT = """
import sys, time
from posenc.lab.experiments.runs import RunStore
sys.path.insert(0, {tests!r})
from test_runs import _sleeps_and_reports_its_pid
RunStore({out!r}).sweep([("a", 0), ("b", 0)], lambda r, s: {{}}, _sleeps_and_reports_its_pid, workers=2)
"""


def _sleeps_and_reports_its_pid(row, seed, expected):
    import os
    import pathlib
    import time

    pathlib.Path(os.environ["POSENC_TEST_PIDS"], f"{row}.pid").write_text(str(os.getpid()))
    time.sleep(60)
    return {}


def test_workers_end_with_a_killed_parent(tmp_path):
    """lengthgen's workers went on training every queued run after the parent was killed, then
    blocked forever (issue 22): they now get SIGTERM when their parent dies (Linux)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    if not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    pids = tmp_path / "pids"
    pids.mkdir()
    code = PARENT.format(tests=os.path.dirname(__file__), out=str(tmp_path / "out"))
    parent = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "POSENC_TEST_PIDS": str(pids)})
    deadline = time.monotonic() + 60
    while len(list(pids.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    workers = [int(p.read_text()) for p in pids.glob("*.pid")]
    assert len(workers) == 2, "the workers did not start"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in workers if _running(pid)]
    assert not alive, f"workers {alive} outlived their parent"


def _running(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) is not running
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
    return True
