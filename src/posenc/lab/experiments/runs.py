"""The run store every experiment writes to: one folder, one record per (row, seed), resume.

Layout of an experiment's ``--out`` folder::

    out/
      runs/<row>-seed<seed>.json         a finished run's record (written atomically)
      checkpoints/<row>-seed<seed>.pt    its training checkpoint (see posenc.lab.train.train_lm)
      results.json, ...                  what the experiment merges from the records

A *row* is whatever the experiment tabulates (an encoding, an encoding extended with a RoPE
scaling, a task); the store knows nothing more of it than its name. Each record holds the
``fingerprint`` of what its result depends on (arguments, corpus, posenc version); a stored
record is reused only when that matches exactly, and a different one is refused, never
silently overwritten, so one folder never mixes two settings. A run killed mid-way leaves
either no record or a whole one (and a checkpoint to resume training from).

:meth:`RunStore.sweep` spreads a list of runs over the ranks of a torchrun group
(:mod:`posenc.lab.experiments.distributed`) and gives rank 0 every record once all are done; with
``workers`` > 1 each rank also runs its share in that many local processes.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import torch

from posenc.lab.checkpoint import (
    CheckpointMismatch, atomic_write_bytes, read_json, remove_stale_temporaries,
)
from posenc.lab.experiments import distributed
from posenc.lab.train import TrainingDiverged
from posenc.errors import InvalidArgument, PosencError

#: Steps between training checkpoints. Not a user option (it changes no result); the
#: environment variable ``POSENC_CHECKPOINT_EVERY`` overrides it so that the kill-and-resume
#: test can land a SIGKILL between two checkpoints of a tiny run.
CHECKPOINT_EVERY = 250


def checkpoint_every() -> int:
    """Steps between training checkpoints: ``POSENC_CHECKPOINT_EVERY`` if a positive integer, else 250."""
    value = os.environ.get("POSENC_CHECKPOINT_EVERY", "")
    return int(value) if value.strip().isdigit() and int(value) > 0 else CHECKPOINT_EVERY


class Reporter:
    """Progress callbacks of a sweep, per (row, seed); the default does nothing (the CLI
    draws rich bars). ``record`` is the run's record as stored; ``skipped`` says it was
    found finished in the store rather than computed."""

    def run_started(self, row: str, seed: int, steps: int, resumed_step: int) -> None: ...
    def train_step(self, step: int, loss: float) -> None: ...
    def eval_started(self, row: str, seed: int, total_windows: int) -> None: ...
    def eval_advanced(self, windows: int) -> None: ...
    def run_finished(self, row: str, seed: int, record: dict, skipped: bool) -> None: ...


def file_stem(row: str) -> str:
    """A row's name as a file name: a plan row's ``/`` (a path separator) becomes ``__`` and
    its ``:`` (not allowed on Windows) ``-``, so ``rope@sliding/nope:4`` is stored as
    ``rope@sliding__nope-4``. Encoding names hold neither ``__`` nor ``-``, so no two rows share
    a file; every other row's name is its file name, as before."""
    return row.replace("/", "__").replace(":", "-")


class RunAborted(PosencError):
    """A sweep stopped by something outside posenc (a worker process killed by the OS): the
    finished runs are kept; the CLI says so and exits 1, not as a bug."""


def _start_worker(threads: int, parent: int) -> None:
    """Initializer of a sweep's worker processes: torch's threads, and on Linux a SIGTERM when
    the parent dies (killed: its workers used to go on training, then block forever)."""
    torch.set_num_threads(threads)
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


@contextlib.contextmanager
def _folder_lock(folder: Path):
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, as before
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ".posenc.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "pid unknown"
            raise InvalidArgument(f"--out: {folder} is in use by another posenc run ({holder}); wait for it to "
                                  "finish or use another --out folder") from None
        # a lock whose holder died is released by the kernel with it: nothing stale to take over
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def diverged_record(fingerprint: dict, error: Exception) -> dict:
    """The record of a run whose training diverged (:class:`~posenc.lab.train.TrainingDiverged`):
    its fingerprint, the fingerprint's ``task`` / ``encoding`` (or ``row``) / ``seed`` (what the merge reads)
    and ``diverged``, the error's message; no scores. Stored like a finished run, so a rerun
    with the same arguments reports it again instead of training it again (another ``--lr`` is
    another fingerprint)."""
    keys = {key: fingerprint[key] for key in ("task", "encoding", "seed") if key in fingerprint}
    if "encoding" not in keys and "row" in fingerprint:  # lengthgen's fingerprints name the row "row"
        keys["encoding"] = fingerprint["row"]
    return {"fingerprint": fingerprint, **keys, "diverged": str(error)}


def is_diverged(record: dict) -> bool:
    """A record of :func:`diverged_record`."""
    return "diverged" in record


def _check_shape(record: Any, path: Path, scores: str | None) -> None:
    """A record is a JSON object with its fingerprint (an object) and either ``diverged`` (a
    message) or, where ``scores`` names the key, its scores there (an object)."""
    ok = isinstance(record, dict) and isinstance(record.get("fingerprint"), dict)
    if ok and "diverged" in record:
        ok = isinstance(record["diverged"], str)
    elif ok and scores is not None:
        ok = isinstance(record.get(scores), dict)
    if not ok:
        raise CheckpointMismatch(f"--out: {path} is not a run record (an object with 'fingerprint'"
                                 + (f" and '{scores}'" if scores else "") + "); it is corrupt: delete it to rerun that run")


def _non_finite_field(value: Any, field: str = "") -> tuple[str, float] | None:
    """The dotted name (``eval.16.loss``) and value of the first NaN or infinity in a record,
    or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (field, value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if (found := _non_finite_field(item, f"{field}.{key}" if field else str(key))) is not None:
            return found
    return None


def _check_values(record: dict, path: Path, scores: str | None, numbers: Sequence[str]) -> None:
    """Each cell of a finished record's scores holds every field of ``numbers`` as a number,
    and the record holds no NaN or infinity anywhere: the merge computes with them, so a
    record that breaks this (edited by hand, or written by something else) is refused here,
    naming its file and field, not met later as a TypeError deep inside the merge."""
    def corrupt(field: str, what: str) -> CheckpointMismatch:
        return CheckpointMismatch(f"{path}: corrupt run record: {field} is {what}; delete it to rerun that run")

    if scores is not None and not is_diverged(record):
        for key, cell in record[scores].items():
            for name in numbers:
                value = cell.get(name) if isinstance(cell, dict) else None
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise corrupt(f"{scores}.{key}.{name}", f"{value!r}, not a number")
    if (found := _non_finite_field(record)) is not None:
        raise corrupt(found[0], f"{found[1]!r}, a non-finite number (NaN or inf: a diverged run)")


def _finite_or_null(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


class RunStore:
    """The records and checkpoints of one experiment's output folder ``out``.

    Args:
        out: the folder (created on the first write); ``runs/`` and ``checkpoints/`` under it.
        scores: the key that holds a finished record's scores, an object (the experiments'
            ``eval``); a stored record without it (and not diverged) is corrupt. None: not checked.
        numbers: the fields each cell of ``scores`` holds as finite numbers (extrapolation's
            ``loss``, lengthgen's ``accuracy``); a stored record with one missing, a string
            or NaN is corrupt.
    """

    def __init__(self, out: str | os.PathLike, scores: str | None = None, numbers: Sequence[str] = ()) -> None:
        self.out = Path(out)
        self.scores = scores
        self.numbers = tuple(numbers)
        self.runs = self.out / "runs"
        self.checkpoints = self.out / "checkpoints"
        if self.out.is_dir():  # what a run killed mid-write left behind (15-40 MB a checkpoint)
            remove_stale_temporaries(self.out)

    def __repr__(self) -> str:
        return f"RunStore({str(self.out)!r})"

    def record_path(self, row: str, seed: int) -> Path:
        """Where the finished record of (row, seed) lives: ``runs/<row>-seed<seed>.json``
        (the row as :func:`file_stem` writes it)."""
        return self.runs / f"{file_stem(row)}-seed{seed}.json"

    def checkpoint_path(self, row: str, seed: int) -> Path:
        """Where the training checkpoint of (row, seed) lives: ``checkpoints/<row>-seed<seed>.pt``."""
        return self.checkpoints / f"{file_stem(row)}-seed{seed}.pt"

    def stored(self, row: str, seed: int, fingerprint: dict) -> dict | None:
        """The finished record of (row, seed), or None if there is none yet.

        Raises:
            CheckpointMismatch: the record is corrupt, or its fingerprint differs from
                ``fingerprint`` (other arguments or another posenc version).
        """
        path = self.record_path(row, seed)
        if not path.exists():
            return None
        record = read_json(path)
        _check_shape(record, path, self.scores)
        if record.get("fingerprint") != fingerprint:
            raise CheckpointMismatch(
                f"--out: {path} holds a run with other arguments or another posenc version; "
                "use another --out folder or delete it"
            )
        _check_values(record, path, self.scores, self.numbers)
        return record

    def write(self, row: str, seed: int, record: dict) -> None:
        """Store ``record`` (which must hold its ``fingerprint``) for (row, seed), atomically, as
        strict JSON.

        Raises:
            InvalidArgument: no fingerprint, or a NaN or infinity in it (a diverged run: a
                record holding one is refused as corrupt when read, so none is stored).
        """
        if "fingerprint" not in record:
            raise InvalidArgument(f"record of {row}-seed{seed}: a stored record must hold its fingerprint")
        if _non_finite_field(record) is not None:  # it would be refused as corrupt when read: never stored
            raise InvalidArgument(f"{row} seed {seed}: the run's results hold a non-finite number (NaN or inf: the run "
                                  "diverged); nothing of it is stored, lower the learning rate (--lr)")
        atomic_write_bytes(self.record_path(row, seed), json.dumps(record, indent=2, allow_nan=False).encode("utf-8"))

    def write_json(self, name: str, obj: Any) -> Path:
        """Write ``obj`` as ``out/name`` atomically (the experiment's merged results), strict
        JSON: a NaN or infinity (a mean over no finite value) is written as null, never as
        the bare ``NaN`` token other parsers refuse. Returns the path."""
        path = self.out / name
        text = json.dumps(_finite_or_null(obj), indent=2, allow_nan=False)
        atomic_write_bytes(path, text.encode("utf-8"))
        return path

    def run(
        self, row: str, seed: int, fingerprint: dict, compute: Callable[[], dict], reporter: Reporter | None = None
    ) -> dict:
        """The record of (row, seed): the stored one, or ``{"fingerprint": fingerprint, **compute()}``
        computed now and stored. ``reporter.run_finished`` is told either way.

        Raises:
            CheckpointMismatch: a stored record from other arguments (see :meth:`stored`).
        """
        reporter = reporter or Reporter()
        record = self.stored(row, seed, fingerprint)
        if record is not None:
            reporter.run_finished(row, seed, record, skipped=True)
            return record
        try:
            record = {"fingerprint": fingerprint, **compute()}
        except TrainingDiverged as err:  # the other runs go on; the merge and the exit status say it
            record = diverged_record(fingerprint, err)
        if distributed.writes_records():
            self.write(row, seed, record)
        reporter.run_finished(row, seed, record, skipped=False)
        return record

    def sweep(
        self,
        jobs: Sequence[tuple[str, int]],
        fingerprint: Callable[[str, int], dict],
        compute: Callable[[str, int, dict], dict],
        reporter: Reporter | None = None,
        workers: int = 1,
    ) -> list[dict] | None:
        """Run (or resume) every (row, seed) of ``jobs`` through :meth:`run`, split across the
        ranks of a torchrun group; ``compute(row, seed, fingerprint)`` makes a record's body.

        ``workers`` > 1: this rank's unfinished runs go to that many spawned processes, each
        with ``torch.get_num_threads() // workers`` threads (at least one). Small models gain
        nothing from a second intra-op thread, so on a CPU this is how a sweep of small runs uses
        every core. ``compute`` is then pickled: a module-level function, or a
        ``functools.partial`` of one, whose arguments pickle. Records are written here, in
        this process, as each run finishes; ``reporter`` hears only ``run_finished`` (the
        workers' steps are not relayed). A failed run stops the runs not yet started, lets the
        running ones finish (their records are kept), then raises its error.

        Returns:
            On rank 0 (the only rank without torchrun) every job's record, in ``jobs``
            order, once every rank has finished its share; None on the other ranks.

        Raises:
            CheckpointMismatch: a stored record from other arguments.
            RuntimeError: a record is missing after every rank finished.
            ValueError: ``workers`` not a positive integer.
        """
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise InvalidArgument(f"workers must be an integer >= 1, got {workers!r}")
        if workers > 1 and distributed.data_parallel() is not None:
            raise InvalidArgument("--workers > 1 and --parallel data or fsdp exclude each other: then every "
                                  "rank trains every run in its own process; use one or the other")
        shard = distributed.current()
        # one run of posenc per --out folder: a second one refuses at once (the ranks of one
        # torchrun group share the folder, so only rank 0 holds the lock)
        with self.exclusive() if shard.is_main else contextlib.nullcontext():
            return self._sweep(jobs, shard, fingerprint, compute, reporter, workers)

    def exclusive(self) -> contextlib.AbstractContextManager:
        """Hold ``OUT/.posenc.lock`` (an advisory ``flock``, released when the process ends,
        however it ends) for the duration of a sweep.

        Raises:
            InvalidArgument: another process holds it (another posenc run on this folder); the
                message names its pid.
        """
        return _folder_lock(self.out)

    def _sweep(self, jobs, shard, fingerprint, compute, reporter, workers) -> list[dict] | None:
        share = distributed.runs_share().take(jobs)
        if workers > 1:
            mine = self._run_in_workers(share, fingerprint, compute, reporter or Reporter(), workers)
        else:
            mine = {}
            for row, seed in share:
                expected = fingerprint(row, seed)
                mine[row, seed] = self.run(row, seed, expected, lambda: compute(row, seed, expected), reporter)
        # the slowest rank sets the pace: records of the other ranks exist only after this
        distributed.barrier()
        if not shard.is_main:
            return None
        records = [mine[job] if job in mine else self.stored(*job, fingerprint(*job)) for job in jobs]
        missing = [self.record_path(*job).stem for job, record in zip(jobs, records) if record is None]
        if missing:
            raise RuntimeError(f"runs missing after every rank finished: {missing}")
        return records

    def _run_in_workers(
        self, share: Sequence[tuple[str, int]], fingerprint: Callable[[str, int], dict],
        compute: Callable[[str, int, dict], dict], reporter: Reporter, workers: int,
    ) -> dict:
        """:meth:`sweep`'s share of runs, the unfinished ones in ``workers`` spawned processes."""
        done, pending = {}, []
        for row, seed in share:
            expected = fingerprint(row, seed)
            record = self.stored(row, seed, expected)
            if record is None:
                pending.append((row, seed, expected))
            else:
                reporter.run_finished(row, seed, record, skipped=True)
                done[row, seed] = record
        if not pending:
            return done
        threads = max(1, torch.get_num_threads() // workers)
        # spawn, not fork: the parent may hold torch's thread pools and a progress display's thread
        with ProcessPoolExecutor(min(workers, len(pending)), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_start_worker, initargs=(threads, os.getpid())) as pool:
            running = {pool.submit(compute, row, seed, expected): (row, seed, expected) for row, seed, expected in pending}
            error = None
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    row, seed, expected = running.pop(future)
                    if future.cancelled():
                        continue
                    if isinstance(future.exception(), TrainingDiverged):
                        record = diverged_record(expected, future.exception())
                        self.write(row, seed, record)
                        reporter.run_finished(row, seed, record, skipped=False)
                        done[row, seed] = record
                        continue
                    if future.exception() is not None:
                        error = error or future.exception()
                        for other in running:
                            other.cancel()
                        continue
                    record = {"fingerprint": expected, **future.result()}
                    self.write(row, seed, record)
                    reporter.run_finished(row, seed, record, skipped=False)
                    done[row, seed] = record
        if isinstance(error, BrokenProcessPool):
            raise RunAborted("a worker process died (killed by the operating system: out of memory?) before its run "
                             "finished; the runs that finished are kept, rerun the same command to resume") from error
        if error is not None:
            raise error
        return done
