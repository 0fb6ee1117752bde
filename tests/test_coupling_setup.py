"""The papers' setup behind `posenc lengthgen`'s +coupled and +abacus rows on addition (issue 23,
item 2): training mixes every operand length 1..N (Cho et al. 2024 and McLeish et al. 2024 both
do), a learned table indexed by task-structured ids starts at the token embeddings' scale (both
papers' code), and the hand-worked ids of a mixed batch."""

from __future__ import annotations

import json
import random
from collections import Counter

import torch

from posenc.lab.cli import main
from posenc.lab.experiments.lengthgen import task_batches
from posenc.lab.experiments.task_positions import (
    TASK_TABLE_INIT_STD,
    AbacusPositions,
    CoupledPositions,
    RandomizedPositions,
)
from posenc.lab.experiments.tasks import Example, get_task


def operand_length(inputs_row: torch.Tensor) -> int:
    return bytes(inputs_row.tolist()).decode().index("+")


def test_training_mixes_every_operand_length_from_1_to_n():
    # Cho et al. (min_n_digits 1 .. max_n_digits) and McLeish et al. (all lengths 1..20) train on
    # every length up to N, not on N alone; so does every lengthgen task (uniform in min_size .. N)
    inputs, _, _ = task_batches(get_task("addition"), 5, CoupledPositions(40))(1000, torch.Generator().manual_seed(0))
    counts = Counter(operand_length(row) for row in inputs)
    assert set(counts) == {1, 2, 3, 4, 5}
    assert all(150 <= c <= 250 for c in counts.values()), counts  # 200 each expected; 5 sigma ~ 63


def test_short_and_long_instances_of_one_batch_get_their_own_coupled_ids():
    # "3+4=" -> "70" and "12+34=" -> "460" (least significant digit first) in one batch: the
    # shorter row is padded, and its ids stop at its END (id 1 + 2 at offset 0)
    scheme = CoupledPositions(range=12)
    short, long = Example("3+4=", "70"), Example("12+34=", "460")
    assert scheme.test_ids("addition", short, None) == [1, 0, 1, 0, 1, 2, 3]
    assert scheme.test_ids("addition", long, None) == [1, 2, 0, 1, 2, 0, 1, 2, 3, 4]
    # a training offset o shifts every id by o: o = 7 is the largest that keeps END (4 + o) below 12
    rng = random.Random(0)
    offsets = {scheme.train_ids("addition", long, rng)[2] for _ in range(400)}
    assert offsets == set(range(8))


def test_a_learned_table_under_task_ids_starts_at_the_tokens_scale():
    assert TASK_TABLE_INIT_STD == 1.0  # the token embeddings' N(0, 1) in posenc.lab.model
    for scheme in (CoupledPositions(40), AbacusPositions()):
        assert scheme.encoding_options("learned") == {"init_std": 1.0}
        assert scheme.encoding_options("rope") == {} and scheme.encoding_options("sinusoidal") == {}
    assert RandomizedPositions(64).encoding_options("learned") == {}


def test_lengthgen_builds_the_coupled_rows_table_at_std_1(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["lengthgen", "--tasks", "addition", "--encodings", "learned+coupled,learned",
            "--steps", "1", "--batch-size", "2", "--lr", "1e-6", "--d-model", "64", "--layers", "1", "--heads", "2",
            "--eval-instances", "1", "--train-size", "3", "--threads", "1", "--workers", "1", "--seeds", "0",
            "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    tables = {}
    for row in ("learned+coupled", "learned"):
        state = torch.load(out / "checkpoints" / f"addition-{row}-seed0.pt", weights_only=False)["model"]
        tables[row] = next(v for k, v in state.items() if k.endswith("weight") and "encoding" in k)
    # a (rows x 64) table drawn from N(0, s^2) has a sample std within a few percent of s
    assert 0.9 < tables["learned+coupled"].std().item() < 1.1
    assert 0.015 < tables["learned"].std().item() < 0.025
    records = json.loads((out / "results.json").read_text())
    assert records["config"]["encodings"] == ["learned+coupled", "learned"]
