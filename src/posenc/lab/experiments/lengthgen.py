"""Length generalization on synthetic tasks: train on instances of size <= N, score exact match
at N/2, N, 1.5N, 2N, 3N, 4N (``posenc lengthgen``).

For each (task, encoding, seed): train the byte-level LM on instances of the task
(:mod:`posenc.lab.experiments.tasks`) whose size is uniform in ``min_size .. N``, with the loss on
the answer tokens only (the answer and its end marker; prompt tokens and padding are
:data:`~posenc.lab.train.IGNORE_INDEX`); then, at each evaluation size, decode
``eval_instances`` fresh instances greedily with the KV cache
(:meth:`~posenc.lab.model.TransformerLM.generate`, one batch per size: all prompts of a size have
one length) and count the instances whose whole answer is right
(:func:`~posenc.lab.experiments.tasks.exact_match`). Every run is a record of a
:class:`~posenc.lab.experiments.runs.RunStore` (row ``<task>-<encoding>``), so an interrupted
sweep resumes and torchrun splits the runs, as ``posenc extrapolate`` does.

``results.json`` (what :func:`run_lengthgen` returns)::

    {"config": {...LengthgenConfig.to_dict(), "posenc_version",
                "task_settings": {task: {"train_size", "steps", "eval_sizes", "size_unit"}}},
     "results": {task: {row: {
         "train_size": N, "size_unit": str, "parameters": int,
         "eval": {"<size>": {"factor": size / N, "accuracy": mean exact match over seeds in [0, 1],
                             "accuracy_std": spread over seeds (0 for one), "token_accuracy": mean
                             share of answer bytes (and END) right at their place, "instances": per seed,
                             "seeds": int, "by_depth": {"<depth>": accuracy} (passkey, multikey)}},
         "not_applicable": {"<size>": why},
         "runs": {"<seed>": that seed's "eval"},
         "positions": {"scheme", ...} (rows with a position suffix only),
         "extension": {"base", "method", "original_max_position_embeddings", "factor" | "parameters"}
                      (extension rows only)}}},
     "ranking": {"learned_at_n": {task: [rows]}, "2": {"per_task": {task: [{"row", "accuracy",
                 "rank"}, ...]}, "mean_reciprocal_rank": {row: float} (over every task)}, "4": {...}},
     "reading": {"threshold": 0.9, "generalization": {task: {row: {"size", "factor", "learned_at_n",
                 "why", "per_seed"}}}, "all_tie": [tasks], "separating": [tasks], "tied_at": {"2": [tasks],
                 "4": [...]}, "mean_reciprocal_rank": {"2": {row: {"mrr", "tasks"}}, "4": {...}}
                 (over the separating tasks; :mod:`posenc.lab.experiments.lengthgen_report`),
                 "extension": {task: {row: {"base", "accuracy": {"1", "2", "4"}, "vs_base": {"2", "4"}}}}
                 (with extension rows only)}}

Beside it, ``summary.md``: the reading as markdown (generalization lengths, the ranking over the
separating tasks with the all-tie tasks named, the comparison with the papers).

The rows of a task are ``encodings`` (every task), then that task's ``task_rows`` (``TASK=ROW``:
the default preset's ``addition=rope+coupled``). A row is an encoding, or the same encoding with
a position suffix
(:mod:`posenc.lab.experiments.task_positions`): ``<encoding>+rand`` (randomized positions, Ruoss
et al. 2023, sampled in training and at test), ``<encoding>+coupled`` (position coupling, Cho et
al. 2024) or ``<encoding>+abacus`` (Abacus, McLeish et al. 2024); such a row's results and
records state its scheme (``"positions"``). A row ``rope+<method>`` (``rope+yarn``,
``rope+self_extend``, ...: :mod:`posenc.lab.experiments.lengthgen_extension`) trains nothing:
it is the task's ``rope`` run's model, from its final checkpoint, scored at every size with that
context extension; it needs ``rope`` among the task's rows, and runs after every trained row
(a second sweep of the same run store: resumed, split across ranks and workers alike).
Accuracies are fractions of instances; sizes are counted in
each task's unit (``size_unit``). Wall-clock times stay in the run records (``runs/*.json``:
``train_seconds``, ``eval_seconds``) so that the same arguments give the same results.json.
"""

from posenc.lab.experiments.lengthgen_config import (
    DEFAULT_ROWS,
    DEFAULT_TASK_ROWS,
    DEFAULT_TASKS,
    EVAL_FACTORS,
    EXTENSION_ROWS,
    EXTENSION_TASKS,
    GPU_PRESETS,
    MAX_EVAL_FACTOR,
    MAX_TRAIN_SIZE,
    OPTIONS,
    PAPER_TASKS,
    PRESETS,
    TASK_SETTINGS,
    LengthgenConfig,
    TaskSetting,
    check_gpu_preset,
    gpu_hours,
    preset_config,
    run_flops,
    task_catalogue,
)
from posenc.lab.experiments.lengthgen_results import (
    CSV_COLUMNS,
    LEARNED_ACCURACY,
    RANK_FACTORS,
    aggregate,
    fractional_ranks,
    rankings,
    write_csv,
)
from posenc.lab.experiments.lengthgen_run import (
    SCORE_NUMBERS,
    encode_training_batch,
    evaluate_extension,
    evaluate_sizes,
    extension_fingerprint,
    fingerprint,
    load_base_model,
    row_name,
    run_lengthgen,
    score,
    task_batches,
    train_and_evaluate,
)

__all__ = [
    "CSV_COLUMNS", "DEFAULT_ROWS", "DEFAULT_TASKS", "DEFAULT_TASK_ROWS", "EVAL_FACTORS", "EXTENSION_ROWS", "EXTENSION_TASKS",
    "GPU_PRESETS", "LEARNED_ACCURACY", "MAX_EVAL_FACTOR", "MAX_TRAIN_SIZE", "OPTIONS", "PAPER_TASKS", "PRESETS",
    "RANK_FACTORS", "SCORE_NUMBERS", "TASK_SETTINGS", "LengthgenConfig", "TaskSetting", "aggregate", "check_gpu_preset",
    "encode_training_batch", "evaluate_extension", "evaluate_sizes", "extension_fingerprint", "fingerprint",
    "fractional_ranks", "gpu_hours", "load_base_model", "preset_config", "rankings", "row_name", "run_flops",
    "run_lengthgen", "score", "task_batches", "task_catalogue", "train_and_evaluate", "write_csv",
]
