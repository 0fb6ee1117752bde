"""Estimate the wall time of a `posenc lengthgen` preset from a few measured training steps
per (task, row), without running it whole.

Each (task, row) of the preset is trained for ``--steps`` steps (the preset's model, batch and
sequences; only the step count differs) and evaluated as the preset does (its sizes and
instances: evaluation does not depend on training), one run at a time in this process with one
thread, as each ``--workers`` process runs. A run's estimate is its task's steps x the measured
seconds per step + its measured evaluation seconds; the preset's wall time is the sum over its
runs divided by ``--workers`` (the default run's records, docs/results/lengthgen/runs, add up to
2.0x its wall time with 2 workers: the runs split evenly). The machine is shared: the script
prints the per-task basis so that the estimate can be read against the load it was taken under.

    PYTHONPATH=src python benchmarks/lengthgen_estimate.py --preset default --steps 40 --baseline docs/results/lengthgen

With ``--baseline``, it also scales a stored run's own times (full steps, measured when it ran)
by the ratio of the preset's rows to the stored rows, measured here per task side by side: the
load of the moment cancels from that ratio, where it does not from the plain estimate.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from posenc.lab.experiments.lengthgen import preset_config, run_lengthgen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--steps", type=int, default=40, help="measured training steps per (task, row)")
    parser.add_argument("--workers", type=int, default=2, help="runs at once in the estimated run")
    parser.add_argument("--baseline", default=None, help="a stored run's folder (e.g. docs/results/lengthgen): also "
                        "scale its measured times by the ratio of the preset's rows to its rows, measured here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    full = preset_config(args.preset)
    short = preset_config(args.preset, steps=args.steps)
    with tempfile.TemporaryDirectory() as out:
        run_lengthgen(short, Path(out), workers=1)
        records = [json.loads(p.read_text()) for p in sorted((Path(out) / "runs").glob("*.json"))]
    per_task: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    per_row: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    total = 0.0
    for record in records:
        per_row[record["encoding"]][0] += full.task_steps(record["task"]) * record["train_seconds"] / args.steps
        per_row[record["encoding"]][1] += record["eval_seconds"]
        task = record["task"]
        per_step = record["train_seconds"] / args.steps
        seconds = full.task_steps(task) * per_step + record["eval_seconds"]
        per_task[task][0] += per_step * 1000
        per_task[task][1] += seconds
        per_task[task][2] += 1
        total += seconds
    print(f"preset {args.preset}: {len(records)} runs, {args.steps} steps measured per run, one thread")
    print("| task | steps | runs | mean ms / step | estimated run-seconds |")
    print("|---|---|---|---|---|")
    for task, (ms, seconds, runs) in per_task.items():
        print(f"| {task} | {full.task_steps(task)} | {runs} | {ms / runs:.1f} | {seconds:.0f} |")
    print("| row | estimated training seconds (all tasks) | measured evaluation seconds |")
    print("|---|---|---|")
    for row, (train, evaluation) in per_row.items():
        print(f"| {row} | {train:.0f} | {evaluation:.1f} |")
    print(f"sum {total:.0f} run-seconds; with {args.workers} workers about {total / args.workers / 60:.1f} min")
    if args.baseline:
        scaled_estimate(records, full, args)


def scaled_estimate(records: list[dict], full, args) -> None:
    """The estimate that the machine's load cancels from: per task, the stored run's seconds of
    the rows it had (``--baseline``'s records, full steps) times the ratio, measured here side by
    side, of all the preset's rows to those rows on that task."""
    stored = [json.loads(p.read_text()) for p in sorted((Path(args.baseline) / "runs").glob("*-seed0.json"))]
    old_rows = {(r["task"], r["encoding"]) for r in stored}
    total_old = total_new = 0.0
    print("| task | stored seconds (its rows) | measured ratio, all rows / stored rows | estimated seconds |")
    print("|---|---|---|---|")
    def run_seconds(r: dict) -> float:
        return full.task_steps(r["task"]) * r["train_seconds"] / args.steps + r["eval_seconds"]

    for task in full.tasks:
        measured_all = sum(run_seconds(r) for r in records if r["task"] == task)
        measured_old = sum(run_seconds(r) for r in records if r["task"] == task and (task, r["encoding"]) in old_rows)
        base = sum(r["train_seconds"] + r["eval_seconds"] for r in stored if r["task"] == task)
        if not measured_old:
            continue
        ratio = measured_all / measured_old
        total_old += base
        total_new += base * ratio
        print(f"| {task} | {base:.0f} | {ratio:.2f} | {base * ratio:.0f} |")
    print(f"stored rows {total_old:.0f} run-seconds ({total_old / args.workers / 60:.1f} min with {args.workers} workers); "
          f"the preset about {total_new:.0f} run-seconds, {total_new / args.workers / 60:.1f} min with {args.workers} workers")


if __name__ == "__main__":
    main()
