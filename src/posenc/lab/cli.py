"""The ``posenc`` command.

Bad arguments, whatever their source (the parser, a config check, a missing corpus), print one
line on stderr, ``posenc: error: ...``, and exit with code 2; no traceback. Any other exception
is a bug: one line, ``posenc: internal error: ...``, exit code 1 (``POSENC_DEBUG=1`` shows the
traceback of either).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from posenc.errors import InvalidArgument, PosencError

app = typer.Typer(
    name="posenc",
    help="Transformer positional encodings: list them, compare their length extrapolation on real text.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
#: The width of a table written to a file or a pipe: rich's 80 columns would wrap its rows.
PIPED_WIDTH = 1000
#: Progress lines for log files (stderr: stdout keeps the results).
log_console = Console(stderr=True)


class UsageError(typer.BadParameter):
    """A bad argument found after parsing; shown as one line, exit code 2."""


def _split_list(value: str | None, argname: str, cast=str) -> tuple | None:
    if value is None:
        return None
    from posenc.lab.experiments.frame import split_rows

    items = split_rows(value)  # a row's options, path[a=1,b=2], keep their commas
    if not items:
        raise UsageError(f"{argname}: give a comma-separated list, got {value!r}")
    try:
        return tuple(cast(v) for v in items)
    except ValueError:
        raise UsageError(f"{argname}: every item must be {cast.__name__}, got {value!r}") from None


# --- the options every sweep command (extrapolate, lengthgen) takes ---------------------------

Encodings = Annotated[Optional[str], typer.Option(help=(
    "Comma-separated rows (default: the preset's): encoding names (posenc list), with constructor options "
    "NAME[key=value,...] (path[forget_gate=true]: PaTH-FoX; quote the row for the shell), or position plans "
    "BASE/PART:N/PART:N...: BASE on every layer, each PART on every N-th layer (layers N-1, 2N-1, ...; a later part "
    "wins), a part being ENCODING or ENCODING@full|@sliding|@chunked (sliding window / chunks of L/4 tokens, L the training "
    "length; or @sliding=W, @chunked=C) and nope a layer without positions. rope/nope:4: NoPE every 4th layer "
    "over RoPE (SmolLM3); rope@sliding/nope:4: RoPE on sliding-window layers, NoPE with full attention on every "
    "4th (Cohere2). A row may end in +rand (randomized positions) where the command takes it, and in lengthgen in "
    "+coupled or +abacus (position coupling, Abacus: ids that follow the task's structure, on addition, copy and "
    "reverse). lengthgen also takes rope+<method> (linear, ntk, dynamic, yarn, dynamic_yarn, llama3, yarn_log, theta_scale, "
    "telechat3_yarn, self_extend, "
    "rerope, leaky_rerope, dca, string, lm_infinite, streaming_llm): the task's trained rope model run with that "
    "context extension, no training."))]
LearningRate = Annotated[Optional[float], typer.Option(help="Peak learning rate.")]
DModel = Annotated[Optional[int], typer.Option(help="Model width.")]
Layers = Annotated[Optional[int], typer.Option(help="Number of transformer blocks.")]
Heads = Annotated[Optional[int], typer.Option(help="Attention heads.")]
Seeds = Annotated[Optional[str], typer.Option(help="Comma-separated seeds in [0, 2**63), e.g. 0,1,2.")]
Device = Annotated[str, typer.Option(help="torch device, e.g. cpu or cuda.")]
Threads = Annotated[Optional[int], typer.Option(help="CPU threads for torch, 1 to 4 x the CPU count (default: torch's choice).")]
KeepGoing = Annotated[bool, typer.Option(
    "--keep-going/--no-keep-going",
    help="Exit 0 when a run diverged (a NaN or infinite loss: stopped, stored as diverged, shown in the table); "
    "by default the command then exits 2 after writing the results of the others.")]
Parallel = Annotated[str, typer.Option(
    help="Under torchrun --nproc-per-node N: 'runs' splits the runs across the N processes; 'data' trains "
    "every run data-parallel on all N (DistributedDataParallel; the global batch, the schedule and the "
    "checkpoint do not depend on N; rank 0 writes); 'fsdp' the same with FSDP2 sharding.")]


def _randomized_positions_help(sample: str, bound: str) -> str:
    return ("Also train every encoding with randomized positions (Ruoss et al. 2023): each "
            f"{sample} positions a sorted random sample from [0, {bound}); evaluated at ordinary positions (rows "
            "<encoding>+rand)." + (" N >= L." if bound == "N" else ""))


def _start_sweep(device: str, threads: int | None, workers: int | None = None, parallel: str = "runs") -> str:
    """What every sweep command does before its config: torch's threads set, the device and
    worker count checked before any work (one line, not a traceback from deep inside), this
    process joined to its torchrun group. Rank 0 reports; the others print only errors.
    Returns the device this rank runs on."""
    from posenc._validation import check_device
    from posenc.lab.experiments import distributed
    from posenc.lab.experiments.limits import check_threads

    check_threads(threads, "--threads")
    check_threads(workers, "--workers")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    check_device(device, "--device")
    if parallel not in distributed.PARALLEL:
        raise UsageError(f"--parallel must be one of {', '.join(distributed.PARALLEL)}, got {parallel!r}")
    device = distributed.init_from_env(device, parallel)  # under torchrun: this rank's share of the work
    console.quiet = log_console.quiet = not distributed.current().is_main
    return device


def _sweep_config(preset_config: Callable, preset: str, *, encodings: str | None, seeds: str | None,
                  layers: int | None, heads: int | None, **options):
    """An experiment's config from a sweep command's options: the comma-separated lists
    split, ``--layers`` / ``--heads`` as the configs' ``num_layers`` / ``num_heads``."""
    return preset_config(preset, encodings=_split_list(encodings, "--encodings"), num_layers=layers, num_heads=heads,
                         seeds=_split_list(seeds, "--seeds", int), **options)


def _check_machine(config, out: Path, *, concurrent: int = 1, hint: str) -> None:
    """Before any corpus is read or any run trained: the largest run (``concurrent`` at once)
    fits in the free memory, and ``out`` is a folder this process can write with room for
    the next checkpoint of each run (old and new side by side)."""
    from posenc.lab.experiments.limits import (
        check_memory,
        check_out_folder,
        checkpoint_bytes,
    )

    check_memory(config.workloads(), config.device, concurrent, hint)
    table = config.holds_a_table()
    models = [w.model for w in config.workloads()] or [config.model]
    check_out_folder(out, 2 * concurrent * max(checkpoint_bytes(m, table) for m in models))


#: The sizes a sweep's memory estimate depends on, named in its refusal.
EXTRAPOLATE_SIZES = "--batch-size, --train-len, --d-model, --layers, --eval-factors or --randomized-positions"
LENGTHGEN_SIZES = "--batch-size, --train-size, --d-model, --layers, --eval-instances, --randomized-positions or --workers"


Reporter = TypeVar("Reporter", bound="RichReporter")


def _run_sweep(reporter: Callable[[Progress], Reporter], run: Callable[[Reporter], dict | None]) -> tuple[dict | None, Reporter]:
    """``run(reporter(progress))`` under the sweep's progress bars (gone once it returns):
    the results (None on a torchrun rank other than 0) and the reporter."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        drawn = reporter(progress)
        return run(drawn), drawn


@app.command("list")
def list_encodings() -> None:
    """List the registered encodings with the hooks each uses."""
    from posenc.encodings import REGISTRY

    table = Table("name", "hooks", "class", title="posenc encodings")
    for name, cls in REGISTRY.items():
        table.add_row(name, ", ".join(sorted(cls.hooks)) or "(none)", cls.__name__)
    console.print(table)


#: Seconds between the plain progress lines a run prints (on stderr, as progress goes) when its
#: output is not a terminal (a batch job, CI, nohup: rich draws no bar there).
PLAIN_PROGRESS_SECONDS = 30.0


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class RichReporter:
    """Draws a training bar and an evaluation bar per (row, seed): an encoding or a row built on one."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = None

    def _replace(self, description: str, total: int, completed: int = 0) -> None:
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(description, total=max(total, 1), completed=completed, loss="")

    def run_started(self, row, seed, steps, resumed_step):
        self.resumed_step = resumed_step
        note = f" (resumed at {resumed_step})" if resumed_step else ""
        self._replace(f"train {escape(row)} seed {seed}{note}", steps, resumed_step)
        self.run_name, self.steps = f"{escape(row)} seed {seed}", steps
        self.started, self.first_step, self.last_line = time.monotonic(), resumed_step, time.monotonic()

    def loss_text(self, loss: float) -> str:
        """The training loss as the bar and the plain lines show it (nats -> bits per byte)."""
        return f"loss {loss / 0.6931471805599453:.3f} bpb"

    def train_step(self, step, loss):
        self.progress.update(self.task, completed=step + 1, loss=self.loss_text(loss))
        if not self.progress.console.is_terminal:  # a log file draws no bar: a line now and then
            now = time.monotonic()
            if now - self.last_line >= PLAIN_PROGRESS_SECONDS or step + 1 == self.steps:
                self.last_line = now
                log_console.print(self.progress_line(step + 1, loss, now - self.started), highlight=False)

    def progress_line(self, done: int, loss: float, elapsed: float) -> str:
        """E.g. ``train rope seed 0: step 300/1500, loss 3.120 bpb, 9.8 steps/s, ~2m03s left``."""
        rate = (done - self.first_step) / elapsed if elapsed > 0 else 0.0
        left = f", ~{_duration((self.steps - done) / rate)} left" if rate > 0 and done < self.steps else ""
        return f"train {self.run_name}: step {done}/{self.steps}, {self.loss_text(loss)}, {rate:.1f} steps/s{left}"

    def eval_started(self, row, seed, total_windows):
        self._replace(f"eval  {escape(row)} seed {seed}", total_windows)

    def eval_advanced(self, windows):
        self.progress.advance(self.task, windows)

    def run_finished(self, row, seed, record, skipped):
        if self.task is not None:
            self.progress.remove_task(self.task)
            self.task = None
        if "diverged" in record:
            state = "stored earlier" if skipped else "stopped"
            self.progress.console.print(f"[bold]{escape(row)}[/] seed {seed} [red]diverged[/] ({state}): {record['diverged']}")
            return
        state = "already done" if skipped else self.time_spent(record)
        if not skipped and getattr(self, "resumed_step", 0):
            state += f", resumed at step {self.resumed_step}"
        self.progress.console.print(f"[bold]{escape(row)}[/] seed {seed} ({state}) {self.scores(record)}")

    def time_spent(self, record: dict) -> str:
        return f"{record['train_seconds']:.0f}s train"

    def scores(self, record: dict) -> str:
        return "bits/byte at " + " ".join(f"{n}:{c['bits_per_byte']:.3f}" for n, c in record["eval"].items())


@app.command()
def extrapolate(
    encodings: Encodings = None,
    preset: str = typer.Option("default", help="quick | default | full (every registered encoding) | gpu (L=512, "
                               "25.5M parameters, eval to 16L with sliding windows; ~10 min per encoding on one H100) | paper (Press et al.'s "
                               "Table 2 model and rows, 201M parameters; GPUs only: ~15 h on one H100, ~2 h on 8 at 15% MFU) "
                               "| extension (every context extension and DroPE on the same rope checkpoints, 3 seeds, "
                               "L/2..16L and a passkey map)."),
    corpus: Optional[str] = typer.Option(
        None, help="A text file, a folder of text files, a folder saved by Hugging Face datasets' save_to_disk, or a "
        "Hugging Face dataset name NAME[:CONFIG], e.g. Salesforce/wikitext:wikitext-103-raw-v1 (pip install "
        "'posenc[data]'). Default: the Python stdlib source."),
    train_len: Optional[int] = typer.Option(None, help="Training length L in tokens (bytes)."),
    steps: Optional[int] = typer.Option(None, help="Training steps per run."),
    batch_size: Optional[int] = typer.Option(None, help="Training batch size."),
    lr: LearningRate = None,
    d_model: DModel = None,
    layers: Layers = None,
    heads: Heads = None,
    eval_factors: Optional[str] = typer.Option(None, help="Evaluation lengths as multiples of L, e.g. 1,2,4,8,16 "
                                               "(--preset extension adds L/2)."),
    eval_tokens: Optional[int] = typer.Option(None, help="Validation tokens read at every length."),
    eval_stride: Optional[int] = typer.Option(
        None, help="Also evaluate with sliding windows of this stride S (1 <= S <= L; Press et al.): each token "
        "predicted after at least length - S tokens of context. The gpu preset uses S = L."),
    seeds: Seeds = None,
    out: Path = typer.Option(Path("results/extrapolate"), help="Output folder (results.json, results.csv, figure, checkpoints)."),
    device: Device = "cpu",
    rope_scaling: Optional[str] = typer.Option(
        None, help="Also evaluate the trained rope model with these RoPE scalings at inference, factor = length / L: "
        "a comma-separated list of linear, ntk, dynamic, yarn, dynamic_yarn, llama3, yarn_log, theta_scale, telechat3_yarn "
        "(rows rope+<method>; see "
        "--extension-factor), and the training-free maps self_extend, rerope, leaky_rerope, dca, string, lm_infinite, "
        "streaming_llm (their windows the references' scaled to L; no fine-tune rows).",
    ),
    finetune_steps: Optional[int] = typer.Option(
        None, help="Also fine-tune a copy of the rope model for N steps at finetune-factor x L with each scaling "
        "(and without: the control), then evaluate it (rows rope+<method>+ft, rope+ft).",
    ),
    finetune_factor: Optional[int] = typer.Option(None, help="Fine-tune length as a multiple of L, and the scaling factor (default 4)."),
    extension_factor: Optional[int] = typer.Option(
        None, help="The rope+<method> rows at this factor F at every length (a config fixed for F x L), instead of "
        "factor max(1, length / L)."),
    drope_steps: Optional[int] = typer.Option(
        None, help="DroPE (arXiv 2512.12167): the rope model with its rotation dropped, recalibrated N steps at L "
        "(row rope+drope), beside NoPE trained steps + N from scratch (row nope+long)."),
    drope_qk_norm: Optional[bool] = typer.Option(None, "--drope-qk-norm/--no-drope-qk-norm",
                                                 help="Also the DroPE row with a QK-norm (rope+drope+qknorm)."),
    passkey_instances: Optional[int] = typer.Option(
        None, help="Also a zero-shot passkey map of every row: this many prompts per length and key depth."),
    randomized_positions: Optional[int] = typer.Option(None, help=_randomized_positions_help("window's", "N")),
    threads: Threads = None,
    parallel: Parallel = "runs",
    keep_going: KeepGoing = False,
    bf16: Optional[bool] = typer.Option(None, "--bf16/--no-bf16", help="bf16 autocast for training and evaluation "
                                        "(default: on with --device cuda, off on the CPU)."),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile the model (default: "
                                           "on with --device cuda, off on the CPU)."),
) -> None:
    """Train each encoding at length L on real text, evaluate at L, 2L, ... 16L: which still works?

    Rerun with the same arguments to resume an interrupted sweep: finished runs are reused.
    Under `torchrun --nproc-per-node N`, the (encoding, seed) runs are split across the N
    processes (or, with --parallel data, each trained on all N) and rank 0 writes the merged results.
    """
    from posenc._validation import check_device
    from posenc.lab.data import load_corpus
    from posenc.lab.experiments.extrapolation import (
        ROW_PROVIDERS,
        preset_config,
        run_extrapolation,
    )
    from posenc.lab.experiments.extrapolation_config import check_gpu_preset
    from posenc.lab.experiments.limits import parameter_floor
    from posenc.lab.experiments.extension_report import has_extension_rows
    from posenc.lab.experiments.extrapolation_report import console_tables, plot_extension, plot_extrapolation

    device = _start_sweep(device, threads, parallel=parallel)
    on_cuda = check_device(device, "--device").type == "cuda"
    bf16 = on_cuda if bf16 is None else bf16
    compile = on_cuda if compile is None else compile

    config = _sweep_config(
        preset_config, preset, encodings=encodings, seeds=seeds, layers=layers, heads=heads,
        train_len=train_len, steps=steps, batch_size=batch_size, lr=lr, d_model=d_model,
        eval_factors=_split_list(eval_factors, "--eval-factors", int), eval_tokens=eval_tokens, device=device,
        extension_methods=_split_list(rope_scaling, "--rope-scaling"), finetune_steps=finetune_steps,
        finetune_factor=finetune_factor, randomized_positions=randomized_positions, eval_stride=eval_stride,
        extension_factor=extension_factor, drope_steps=drope_steps, drope_qk_norm=drope_qk_norm,
        passkey_instances=passkey_instances,
        autocast="bfloat16" if bf16 else None, compile=compile or None,
    )
    check_gpu_preset(preset, config, parameter_floor(config.model, table=False))
    _check_machine(config, out, hint=EXTRAPOLATE_SIZES)
    data = load_corpus(corpus)
    console.print(f"[bold]corpus[/] {data.describe()}")
    model, train = config.model, config.train
    console.print(
        f"[bold]runs[/] {escape(', '.join(config.encodings))} x seeds {list(config.seeds)}; L={config.train_len}, "
        f"eval {config.eval_lengths}; d_model {model.d_model}, {model.num_layers} layers, {model.num_heads} heads; "
        f"{train.steps} steps x batch {train.batch_size}, lr {train.lr}"
        + ("; bf16 autocast" if train.autocast else "") + ("; compiled" if train.compile else "")
        + (f"; sliding-window eval, stride {config.eval_stride}" if config.eval_stride else "")
    )
    if randomized := [row for row in config.rows if row.randomized]:
        console.print(f"[bold]randomized-position rows[/] {', '.join(randomized)} (positions from [0, {config.randomized_positions}))")
    for provider in ROW_PROVIDERS:
        if rows := provider.rows(config):
            console.print(f"[bold]{provider.name} rows[/] {', '.join(rows)}")
    started = time.perf_counter()
    summary, _ = _run_sweep(RichReporter, lambda reporter: run_extrapolation(config, data, out, reporter))
    if summary is None:  # not rank 0: rank 0 merges the runs and reports
        return
    figure = plot_extrapolation(summary, out / "extrapolation.png")
    for table in console_tables(summary, eval_stride=config.eval_stride, passkey=bool(config.passkey_instances)):
        console.print(table)
    written = [out / "results.json", out / "results.csv", figure]
    if has_extension_rows(summary):  # summary.md is run_extrapolation's
        written += [out / "summary.md", plot_extension(summary, out / "extension.png")]
    console.print(f"wrote {', '.join(map(str, written))} in {time.perf_counter() - started:.0f}s")
    _stop_if_diverged({row: res for row, res in summary["results"].items()}, keep_going)


def _stop_if_diverged(results: dict, keep_going: bool) -> None:
    """Exit 2 (TrainingDiverged) naming the rows with a diverged seed, unless ``keep_going``:
    the results of the other runs are written by then, and the diverged ones are stored as such."""
    from posenc.lab.train import TrainingDiverged

    diverged = [f"{row} seed {seed}" for row, res in results.items() for seed in (res.get("diverged") or {})]
    if diverged and not keep_going:
        raise TrainingDiverged(f"{len(diverged)} run(s) diverged ({', '.join(diverged)}): stored as diverged and shown "
                               "in the table; lower --lr and use another --out, or pass --keep-going to exit 0")


class TaskReporter(RichReporter):
    """RichReporter for ``posenc lengthgen``: the training bar shows the answer-token loss, and
    each finished run prints its exact-match accuracy per size. ``seconds`` adds up each
    task's training and evaluation wall time (stored runs included, from their records)."""

    def __init__(self, progress: Progress, runs: int) -> None:
        super().__init__(progress)
        self.seconds: dict[str, list[float]] = {}
        self.overall = progress.add_task("runs finished", total=runs, loss="")

    def loss_text(self, loss: float) -> str:
        return f"answer loss {loss:.3f}"

    def run_finished(self, row, seed, record, skipped):
        self.progress.advance(self.overall)
        spent = self.seconds.setdefault(record["task"], [0.0, 0.0])
        spent[0] += record.get("train_seconds", 0.0)  # a diverged run's record has no times
        spent[1] += record.get("eval_seconds", 0.0)
        super().run_finished(row, seed, record, skipped)

    def time_spent(self, record: dict) -> str:
        return f"{record['train_seconds']:.0f}s train, {record['eval_seconds']:.0f}s eval"

    def scores(self, record: dict) -> str:
        return "exact match at size " + " ".join(f"{n}:{c['accuracy']:.2f}" for n, c in record["eval"].items())


@app.command()
def lengthgen(
    tasks: Optional[str] = typer.Option(None, help="Comma-separated tasks: copy, reverse, sort, addition, flipflop, "
                                        "selective_copy, passkey, mqar, parity, modular, cycle, bucket_sort, duplicate, "
                                        "missing, multikey, vartrack, counting; --list describes them (default: the preset's)."),
    encodings: Encodings = None,
    preset: str = typer.Option("default", help=(
        "quick (nope, rope, alibi on copy and flipflop; ~1 min) | default (the six core encodings, rope+rand and the "
        "hybrid rope/nope:3 on copy, reverse, addition, flipflop, passkey, and rope+coupled on addition; ~12 min on 2 "
        "cores) | full (every task on every registered encoding and the hybrid plans) | extension (the trained rope model "
        "with every RoPE scaling and branch-merge map, rows rope+<method>, beside rope, nope and alibi on passkey, "
        "flipflop, copy, reverse, 3 seeds; ~20 min on 2 cores) | paper (one GPU at the NoPE "
        "paper's and Ruoss et al.'s scale: 85M parameters, 40,000 steps, N = 40 tested to 500; ~15 h on one H100, "
        "refused on a CPU).")),
    task_rows: Optional[str] = typer.Option(None, help=(
        "Comma-separated TASK=ROW: rows trained on one task only (e.g. addition=rope+coupled,addition=learned+abacus); "
        "'' for none. Default: the preset's, unless --encodings is given.")),
    train_size: Optional[int] = typer.Option(None, help="N for every task: train on sizes <= N (default: each task's own)."),
    steps: Optional[int] = typer.Option(None, help="Training steps per run (default: each task's own)."),
    batch_size: Optional[int] = typer.Option(None, help="Training batch size (instances)."),
    lr: LearningRate = None,
    d_model: DModel = None,
    layers: Layers = None,
    heads: Heads = None,
    eval_instances: Optional[int] = typer.Option(None, help="Fresh instances scored at each size."),
    seeds: Seeds = None,
    out: Path = typer.Option(Path("results/lengthgen"), help="Output folder (results.json, results.csv, figures, checkpoints)."),
    device: Device = "cpu",
    randomized_positions: Optional[int] = typer.Option(None, help=(
        "L_max of the +rand rows (Ruoss et al. 2023): each sequence's positions a sorted random sample from [0, M), in "
        "training and at test. With no +rand row among the rows, adds a row <encoding>+rand per encoding; a +rand row "
        "(the default preset names rope+rand) takes it as its range, or without it 4x the longest evaluation "
        "sequence.")),
    list_tasks: bool = typer.Option(False, "--list", help="Print every task (unit of size, N, formats, source) and exit."),
    threads: Threads = None,
    workers: Optional[int] = typer.Option(
        None, help="Runs trained at once, each in its own process with threads / workers threads (default: on a "
        "CPU one per core, as these small models gain nothing from a second thread; 1 on CUDA or under torchrun).",
    ),
    parallel: Parallel = "runs",
    keep_going: KeepGoing = False,
) -> None:
    """Synthetic tasks (copy, reverse, addition, flip-flop, passkey, ...): train on sizes <= N,
    score exact match at N/2, N, 1.5N, 2N, 3N, 4N. Which encoding still gets the answer right?

    Rerun with the same arguments to resume an interrupted sweep; under torchrun the
    (task, encoding, seed) runs are split across the processes.
    """
    from posenc.lab.experiments import distributed
    from posenc.lab.experiments.lengthgen import GPU_PRESETS, check_gpu_preset, gpu_hours, preset_config, run_lengthgen
    from posenc.lab.experiments.lengthgen_report import console_tables, lengthgen_task_table, plot_lengthgen

    if list_tasks:
        console.print(lengthgen_task_table())
        return
    device = _start_sweep(device, threads, workers, parallel)
    config = _sweep_config(
        preset_config, preset, encodings=encodings, seeds=seeds, layers=layers, heads=heads,
        tasks=_split_list(tasks, "--tasks"), train_size=train_size, steps=steps, batch_size=batch_size, lr=lr,
        d_model=d_model, eval_instances=eval_instances, device=device, randomized_positions=randomized_positions,
        task_rows=() if task_rows is not None and not task_rows.strip() else _split_list(task_rows, "--task-rows"),
    )
    check_gpu_preset(preset, config)
    model, train = config.model, config.train
    runs = len(config.jobs()) * len(config.seeds)
    if workers is None:
        local = device.startswith("cpu") and distributed.current().world_size == 1
        workers = min(len(os.sched_getaffinity(0)), runs) if local else 1
    _check_machine(config, out, concurrent=min(workers, runs), hint=LENGTHGEN_SIZES)
    console.print(
        f"[bold]runs[/] {', '.join(config.tasks)} x {escape(', '.join(config.rows))} x seeds {list(config.seeds)} "
        f"({runs} runs, {workers} at a time"
        + (f"; {extended} of them extension rows, the rope model run with a method, no training"
           if (extended := len(config.extension_jobs()) * len(config.seeds)) else "") + "); "
        f"d_model {model.d_model}, {model.num_layers} layers, {model.num_heads} heads, MLP x{model.mlp_ratio}; "
        f"batch {train.batch_size}, lr {train.lr}"
    )
    for task in config.tasks:
        extra = config.rows_of(task)[len(config.rows):]
        console.print(
            f"  [bold]{task}[/] N={config.task_train_size(task)}, {config.task_steps(task)} steps, "
            f"eval sizes {config.eval_sizes(task)} x {config.eval_instances} instances"
            + (f"; also {', '.join(extra)}" if extra else "")
        )
    if preset in GPU_PRESETS:
        console.print(f"[bold]expected run time[/] about {gpu_hours(config):.0f} h on one H100 (training FLOPs at 15% of "
                      "bf16 peak, a floor: short sequences and one-token decoding run below it)")
    started = time.perf_counter()
    summary, reporter = _run_sweep(lambda progress: TaskReporter(progress, runs),
                                   lambda reporter: run_lengthgen(config, out, reporter, workers=workers))
    if summary is None:  # not rank 0
        return
    figures = plot_lengthgen(summary, out)
    for table in console_tables(summary):
        console.print(table)
    console.print("[bold]time per task[/] (train + eval, summed over its runs, which may have run side by side): " + ", ".join(
        f"{task} {train:.0f}s + {evaluation:.0f}s" for task, (train, evaluation) in reporter.seconds.items()))
    console.print(f"wrote {out / 'results.json'}, {out / 'results.csv'}, {out / 'summary.md'}, {', '.join(map(str, figures))} "
                  f"in {time.perf_counter() - started:.0f}s")
    _stop_if_diverged({f"{task} {row}": res for task, rows in summary["results"].items() for row, res in rows.items()},
                      keep_going)


def _read_config_json(path: Path) -> dict:
    """A parsed config.json; every failure as one clear error naming the file
    (posenc.hf_config.load_config_json: too deep a nesting included)."""
    from posenc.hf_config import load_config_json

    return load_config_json(path)


def rope_inspection_table(report, title: str) -> Table:
    """One row per frequency pair i (dimensions i and i + r/2, Hugging Face's half-split
    layout): theta_i, the wavelength lambda_i = 2 pi / theta_i in tokens before and after the
    scaling, each against its context (L0, the original; L, the extended), the stretch
    lambda'/lambda, and whether the pair turns fully within L0. A rule marks where that stops:
    YaRN's critical dimension."""
    half = report.rotary_dim // 2
    table = Table(title=title, caption=(
        f"pair i rotates dims (i, i + {half}); λ = 2π/θ_i; λ' after {report.rope_type} scaling.\n"
        f"Critical dimension (YaRN eq. 17, r = 1): {report.critical_dim:.2f}: "
        f"{report.num_full_rotation_pairs} of {half} pairs turn fully within L0 = {report.original_context}."
    ))
    for header in ("i", "θ_i (rad)", "λ (tokens)", "λ / L0", "λ' (tokens)", "λ' / L", "λ'/λ"):
        table.add_column(header, justify="right")
    table.add_column("turns in L0", justify="center")
    critical_row = math.floor(report.critical_dim)
    for i in range(half):
        wavelength = float(report.wavelength_original[i])
        scaled = float(report.wavelength_scaled[i])
        table.add_row(
            str(i), f"{2 * math.pi / wavelength:.3g}", f"{wavelength:.3g}", f"{wavelength / report.original_context:.3g}",
            f"{scaled:.3g}", f"{scaled / report.extended_context:.3g}", f"{scaled / wavelength:.3g}",
            "[green]yes[/]" if bool(report.full_rotation[i]) else "[red]no[/]",
            end_section=i == critical_row,
        )
    return table


@app.command()
def inspect(
    config: Path = typer.Argument(..., help="A model's config.json (Hugging Face format).", show_default=False),
    out: Optional[Path] = typer.Option(None, help="Figure of the wavelengths, png, pdf, svg, ... (default: <config stem>.rope.png "
                                       "in the current folder; a folder: that name in it)."),
    original_context: Optional[int] = typer.Option(None, help="L0, the pre-training context (default: from the config)."),
    extended_context: Optional[int] = typer.Option(None, help="The extended context (default: max(max_position_embeddings, L0 x factor))."),
    layer_type: Optional[str] = typer.Option(None, help="Which layer type's RoPE (default: each layer type whose RoPE differs)."),
) -> None:
    """The RoPE of a model config at a glance: per frequency pair, its wavelength in tokens against
    the original and the extended context, which pairs turn fully within the training context
    (YaRN's critical dimension), the attention factor, a PNG of it, and the per-layer plan
    (position_plan: each layer's encoding and span, layers grouped)."""
    from posenc.lab.plots import figure_path, plot_rope_inspection
    from posenc.rope import from_hf_config, inspect_config

    for value, name in ((original_context, "--original-context"), (extended_context, "--extended-context")):
        if value is not None and value < 1:
            raise UsageError(f"{name} must be a positive integer, got {value}")
    _full_width_when_piped()
    figure_path(out if out is not None else Path("."), f"{config.stem}.rope.png", "--out")  # checked first
    config_dict = _read_config_json(config)
    # a config whose layer types hold different RoPEs (Gemma 3's local and global layers): each
    layer_types = [layer_type] if layer_type is not None else _rope_layer_types(config_dict)
    for each in layer_types:
        stem = config.stem if each is None else f"{config.stem}.{each}"
        figure_out = figure_path(out if out is not None else Path("."), f"{stem}.rope.png", "--out")
        if each is not None and out is not None and out.suffix and len(layer_types) > 1:
            figure_out = out.with_name(f"{out.stem}.{each}{out.suffix}")
        # the library's own reading, so that inspect accepts exactly what from_hf_config accepts
        report = inspect_config(
            config_dict, layer_type=each, rope=from_hf_config(config_dict, layer_type=each),
            original_context=original_context, extended_context=extended_context,
        )
        name = (report.model_type or config.stem) + ("" if each is None else f" ({each} layers)")
        console.print(rope_inspection_table(report, (
            f"{name}: RoPE θ = {report.rope_theta:g}, head_dim {report.head_dim}, rotary_dim {report.rotary_dim}, "
            f"rope_type {report.rope_type}"
        )))
        console.print(
            f"[bold]attention factor[/] {report.attention_factor:.6g} (cos and sin multiplied by it: logits x "
            f"{report.attention_factor ** 2:.6g}); [bold]contexts[/] L0 = {report.original_context}, "
            f"extended L = {report.extended_context}"
        )
        figure = plot_rope_inspection(report, figure_out)
        console.print(f"wrote {figure}")
    _print_position_plan(config_dict)


def _rope_layer_types(config: dict) -> list[str | None]:
    """The layer types whose RoPEs differ (Gemma 3: sliding_attention's theta 10^4,
    full_attention's 10^6 and scaling), in the order of the plan; [None] where one RoPE (or no
    plan) serves every layer."""
    import warnings

    from posenc.errors import PosencError
    from posenc.hf_config import position_plan
    from posenc.encodings.rope.rotary import RoPE
    from posenc.plan import describe_encoding

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = position_plan(config)
    except PosencError:
        return [None]  # from_hf_config says why, or reads the RoPE plainly
    kinds: dict[str, str | None] = {}
    for layer in plan:
        if isinstance(layer.encoding, RoPE):
            kinds.setdefault(describe_encoding(layer.encoding), layer.layer_type)
    types = list(dict.fromkeys(kinds.values()))
    return types if len(kinds) > 1 and None not in types and len(types) == len(kinds) else [None]


def _full_width_when_piped() -> None:
    """Print at full width when stdout is not a terminal (a file, a pipe): tables whole, one
    row a line, as on a wide terminal."""
    if not console.is_terminal:
        console.width = PIPED_WIDTH


def _print_position_plan(config: dict) -> None:
    """The per-layer plan of a config (posenc.hf_config.position_plan), layers grouped, and its
    notes; one line saying why when the family is not in the table or the plan needs a key the
    RoPE does not (a malformed value of a known family is an error, as in the library)."""
    import warnings

    from posenc.errors import MissingKey, PosencError
    from posenc.hf_config import position_plan, reads_model_type

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the notes are printed below
            plan = position_plan(config)
    except PosencError as error:
        if reads_model_type(config.get("model_type")) and not isinstance(error, MissingKey):
            raise
        console.print(f"per-layer plan: not read ({error})", markup=False, highlight=False)
        return
    console.print(f"[bold]per-layer plan[/] ({len(plan)} layers, {plan.model_type}):", highlight=False)
    for line in plan.describe().splitlines():
        console.print(f"  {line}", markup=False, highlight=False)
    for note in plan.notes:
        console.print(f"  note: {note}", markup=False, highlight=False)


@app.command()
def audit(
    config: str = typer.Argument(..., help="A config.json, a folder holding one, or a model id in the local Hugging Face cache; "
                                 "or a GGUF file (FILE.gguf).", show_default=False),
    length: Optional[int] = typer.Option(None, help="Tokens per input (default: the longest window or chunk + 8, at most 1024; 32 without)."),
    against: Optional[str] = typer.Option(None, help="With a GGUF file: its source config.json (a file, a folder holding one, "
                                          "or a model id in the local Hugging Face cache), to compare the plans layer by layer."),
) -> None:
    """Check the per-layer plan posenc reads from a config against the model transformers builds
    from it (tiny, random weights, the positional keys kept): per group of layers, the plan and
    the max difference of the attention outputs, the model's own against posenc's. Exit 0 when
    every layer matches, 1 on a mismatch, 2 for a config or family it cannot read or build.

    A GGUF file: its plan as llama.cpp reads it, against the plan of --against's config.json and
    against the config transformers' own GGUF loader builds from the file, every difference named
    with its GGUF key. Exit 0 when the plans are the same, 1 on a difference, 2 for a file it
    cannot read."""
    from posenc.integrations.gguf_audit import is_gguf_file

    if is_gguf_file(config):
        if length is not None:
            raise UsageError("--length is for a config.json; a GGUF file's audit compares plans, it runs no model")
        _full_width_when_piped()
        _audit_gguf(config, against)
        return
    if against is not None:
        raise UsageError(f"--against is for a GGUF file; {config} is not one (no .gguf name, no GGUF magic)")
    from posenc.integrations.audit import audit as run_audit
    from posenc.integrations.audit import format_layers

    if length is not None and length < 1:
        raise UsageError(f"--length must be a positive integer, got {length}")
    _full_width_when_piped()
    report = run_audit(config, length=length)
    console.print(f"[bold]{report.model_type}[/]: {report.num_layers} layers in the config; audited on {report.audit_layers} "
                  f"({report.sizes}, std-0.2 random weights, float32), {report.length} tokens, {report.method}",
                  highlight=False)

    table = Table(caption="max |diff|: attention outputs, the model's own vs posenc's\n"
                          "tolerance: max(1e-5 x max(1, |output|), 2 x the model's own float32 noise)\n"
                          "own noise: |eager - sdpa|; its float32 angles (every inv_freq x (1 + 2^-23))")
    for header, justify in (("layers", "left"), ("plan", "left"), ("max |diff|", "right"), ("tolerance", "right"),
                            ("", "center")):
        table.add_column(header, justify=justify)
    if report.plan.embedding is not None:
        table.add_row("embedding", escape(report.plan.describe().splitlines()[0].removeprefix("embedding: ")), "", "", "")
    for row in report.rows:
        table.add_row(format_layers(row, report.plan.encoder is not None), escape(row.plan), f"{row.max_diff:.2e}", f"{row.tolerance:.1e}",
                      "[green]ok[/]" if row.ok else "[red]MISMATCH[/]")
    console.print(table)
    for row in report.rows:
        if row.disagreement:
            console.print(f"MISMATCH {format_layers(row, report.plan.encoder is not None)}: {row.disagreement}",
                          markup=False, highlight=False)
    console.print("[bold]plan of the config[/] (all layers):", highlight=False)
    for line in report.plan.describe().splitlines():
        console.print(f"  {line}", markup=False, highlight=False)
    for note in report.plan.notes:
        console.print(f"  note: {note}", markup=False, highlight=False)
    if not report.ok:
        raise typer.Exit(1)


def _audit_gguf(path: str, against: str | None) -> None:
    """``posenc audit FILE.gguf``: the file's plan and notes, then one table per comparison (the
    config.json's plan, transformers' GGUF loader's), each difference with its GGUF key, and the
    sentences naming what was dropped or changed; exit 1 on a difference."""

    from posenc.integrations.gguf_audit import audit_gguf
    from posenc.plan import layer_ranges

    report = audit_gguf(path, against=against)
    read = report.positions
    console.print(f"[bold]{escape(report.path)}[/]: GGUF {read.architecture}, {len(read.plan)} layers, context "
                  f"{read.context_length}, llama.cpp rope type {read.rope_type}", highlight=False)
    console.print("[bold]plan of the file[/] (as llama.cpp reads it, for the checkpoint's weights):", highlight=False)
    for line in read.plan.describe().splitlines():
        console.print(f"  {line}", markup=False, highlight=False)
    for note in read.plan.notes:
        console.print(f"  note: {note}", markup=False, highlight=False)
    for comparison in report.comparisons:
        if comparison.unavailable:
            console.print(f"[bold]against {escape(comparison.against)}[/]: not compared: {escape(comparison.unavailable)}",
                          highlight=False)
            continue
        verdict = "[green]the same plan[/]" if not comparison.differences else \
            f"[red]{len(comparison.differences)} difference(s)[/]"
        console.print(f"[bold]against {escape(comparison.against)}[/]: {verdict}", highlight=False)
        if not comparison.differences:
            continue
        table = Table()
        other = "config.json" if comparison.against.startswith("config.json") else "transformers"
        for header in ("layers", "field", "GGUF key", "the file", other):
            table.add_column(header, justify="left")
        for d in comparison.differences:
            table.add_row(layer_ranges(d.layers), d.field, escape(d.key or ""), escape(d.value), escape(d.reference))
        console.print(table)
        for sentence in comparison.findings:
            console.print(f"DIFFERENCE {sentence}", markup=False, highlight=False)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def plot(
    name: str = typer.Argument(..., help="A registered encoding (see `posenc list`)."),
    out: Optional[Path] = typer.Option(None, help="The figure to write, its format from the extension: png, pdf, svg, ... "
                                       "(default: NAME.png; a folder: NAME.png in it)."),
) -> None:
    """Draw what an encoding does: its position table, rotary decay, bias or relative vectors."""
    from posenc.lab.plots import figure_path, plot_encoding

    figure = figure_path(out if out is not None else Path("."), f"{name}.png", "--out")
    path = plot_encoding(name, figure)  # unknown name: ValueError
    console.print(f"wrote {path}")


@app.command()
def bench(
    what: str = typer.Argument("all", help="rope, attention, throughput or all."),
    quick: bool = typer.Option(False, help="Small sizes, seconds instead of minutes (a smoke run)."),
    threads: int = typer.Option(1, help="torch threads for every side of the comparison (1 to 4 x the CPU count)."),
    device: Optional[str] = typer.Option(
        None, help="Measure on this device in one process (e.g. cuda): RoPE apply against its peers at Liger's "
        "shape, attention per encoding against bias-free SDPA and FlashAttention-2's ALiBi, training throughput; "
        "forward and forward+backward time and peak memory, bf16 on CUDA; tables written to --out. "
        "Default: the CPU benchmarks (a fresh process per attention row).",
    ),
    lengths: Optional[str] = typer.Option(None, help="With --device: attention lengths (each >= 1), e.g. 2048,8192,32768."),
    backends: str = typer.Option("flex,auto", help="With --device: posenc backends per encoding."),
    dtype: Optional[str] = typer.Option(None, help="With --device: attention dtype, float32, bfloat16, float16 or float64 "
                                        "(default bfloat16 on CUDA, float32 elsewhere)."),
    compile: bool = typer.Option(False, help="With --device: torch.compile each model of the throughput benchmark."),
    out: Path = typer.Option(Path("results/bench"), help="With --device: folder for the tables (JSON, CSV, Markdown)."),
) -> None:
    """Speed and memory of posenc side by side with its baselines, in one run, as ratios."""
    from posenc._validation import check_device
    from posenc.lab.bench import Settings, environment, run_suite

    choices = ("rope", "attention", "throughput", "all")
    if what not in choices:
        raise UsageError(f"what must be one of {', '.join(choices)}, got {what!r}")
    from posenc.lab.experiments.limits import check_threads

    check_threads(threads, "--threads")
    if device is None:
        for table in run_suite(what, Settings(quick=quick, threads=threads)):
            table.print()
        return
    check_device(device, "--device")
    settings = _bench_device_settings(device, quick=quick, threads=threads, compile=compile,
                                      lengths=_split_list(lengths, "--lengths", int),
                                      backends=_split_list(backends, "--backends"), dtype=dtype)
    meta = {**environment(), "device": device, "dtype": settings.attention_dtype}
    settings = dataclasses.replace(settings, out=str(out), meta=meta)
    written = []
    for table in run_suite(what, settings):
        table.print()
        written += table.write(out, meta)
    console.print("wrote " + ", ".join(str(p) for p in written))


#: ``posenc bench --dtype``: the floating-point dtypes attention runs in.
BENCH_DTYPES = ("float32", "bfloat16", "float16", "float64")


def _bench_device_settings(device: str, *, quick: bool, threads: int, compile: bool, lengths: tuple | None,
                           backends: tuple, dtype: str | None):
    """The suite's settings for ``posenc bench --device DEVICE`` (measured in this process,
    tables written to ``--out``), the device options checked; torch's threads set."""
    import torch

    from posenc.attention import BACKENDS
    from posenc.lab.bench import Settings

    if lengths is not None and any(n < 1 for n in lengths):
        raise UsageError(f"--lengths: every length must be an integer >= 1, got {','.join(map(str, lengths))}")
    if dtype is not None and dtype not in BENCH_DTYPES:
        raise UsageError(f"--dtype must be a torch dtype name, one of {', '.join(BENCH_DTYPES)}, got {dtype!r}")
    torch.set_num_threads(threads)
    settings = Settings(device=device, quick=quick, threads=threads, compile=compile, lengths=lengths,
                        backends=backends, dtype=dtype)
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise UsageError(f"--backends: unknown {unknown}; choose from {list(BACKENDS)}")
    return settings


#: The smallest ``generate --temperature``: logits / 1e-6 stay finite in float32 for logits
#: up to 10^32, and sampling that cold is greedy decoding already.
MIN_TEMPERATURE = 1e-6


@app.command()
def generate(
    checkpoint: Path = typer.Argument(..., help="A model or training checkpoint, e.g. OUT/checkpoints/rope-seed0.pt from `posenc extrapolate`."),
    prompt: str = typer.Option(..., help="The text to continue (encoded as UTF-8 bytes)."),
    max_new_tokens: int = typer.Option(200, help="How many bytes to generate (>= 1)."),
    temperature: Optional[float] = typer.Option(None, help="Sample at this temperature (>= 1e-6); default greedy."),
    top_k: Optional[int] = typer.Option(None, help="Sample from the K most likely bytes (>= 1); default greedy."),
    seed: int = typer.Option(0, help="Seed of the sampling generator, in [0, 2**63) (same seed, same text)."),
) -> None:
    """Continue a prompt with a trained checkpoint: greedy, or sampling with --temperature / --top-k.

    Prints the continuation only; bytes that are not valid UTF-8 print as U+FFFD.
    """
    import torch

    from posenc.lab.data import decode_bytes, encode_text
    from posenc.lab.experiments.limits import check_seed
    from posenc.lab.model import TransformerLM

    if not prompt:
        raise UsageError("--prompt: give at least one character to continue")
    if temperature is not None and not MIN_TEMPERATURE <= temperature < math.inf:
        raise UsageError(f"--temperature must be a finite number >= {MIN_TEMPERATURE:g} (below it the logits / "
                         f"temperature overflow; for greedy decoding give no --temperature), got {temperature!r}")
    check_seed(seed, "--seed")
    model = TransformerLM.from_checkpoint(checkpoint)  # missing: FileNotFoundError; unreadable: ValueError
    tokens = encode_text(prompt).unsqueeze(0)
    generator = torch.Generator().manual_seed(seed)
    out = model.generate(tokens, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    print(decode_bytes(out[0, tokens.shape[1]:]))


#: Errors that mean "your arguments", not "posenc's bug": posenc's own checks (posenc.errors;
#: the lab's CorpusError and CheckpointMismatch are among them), and the OS refusing a user's path.
ARGUMENT_ERRORS = (InvalidArgument, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def main(argv: list[str] | None = None) -> int:
    """Entry point. A bad argument (the parser's usage errors, posenc's validators, a missing
    file) prints one line and exits 2; any other exception is an internal error: one line
    saying so and how to see the traceback, exit 1. ``POSENC_DEBUG=1`` re-raises either."""
    try:
        code = app(args=argv, prog_name="posenc", standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool):  # click returns typer.Exit's code here
            if code == 130:  # typer's answer to Ctrl-C (KeyboardInterrupt): say so, exit 130
                print("posenc: interrupted", file=sys.stderr)
            return code
    except typer.Exit as exit_:
        return exit_.exit_code
    except typer.Abort:
        print("posenc: interrupted", file=sys.stderr)
        return 130
    except typer.TyperException as err:  # the parser's usage errors
        message = err.format_message()
        if message:
            print(f"posenc: error: {message}", file=sys.stderr)
        # else `posenc` alone: the help is printed, and no empty error line after it
        return 2
    except Exception as err:
        if os.environ.get("POSENC_DEBUG"):
            raise
        if isinstance(err, ARGUMENT_ERRORS):
            print(f"posenc: error: {err}", file=sys.stderr)
            return 2
        if isinstance(err, PosencError):  # stopped from outside posenc (a worker killed by the OS): not a bug
            print(f"posenc: error: {err}", file=sys.stderr)
            return 1
        detail = " ".join(str(err).split())
        print(f"posenc: internal error: {type(err).__name__}: {detail} (a bug in posenc, not in your arguments; "
              "rerun with POSENC_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
