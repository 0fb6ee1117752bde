"""The counting task (issue 23 item 3, after the CoPE paper, Golovneva et al. 2024): answers
checked on hand-worked instances and against an independent count of each prompt, sizes in
the stated unit (symbols), determinism from the seed, the answer never given in the prompt, its
place in the catalogue (listed, not in the default run, +rand only), +coupled/+abacus refused,
and a tiny run end to end with the cope and fox rows."""

import random
import re

import pytest

from posenc.errors import InvalidArgument
from posenc.lab.experiments.tasks import TASKS, eval_examples, get_task

SIZES = (1, 2, 7, 20, 64, 999)


def instances(size, count=40, seed=0):
    task, rng = get_task("counting"), random.Random(seed)
    return [task.example(size, rng) for _ in range(count)]


@pytest.mark.parametrize("prompt, answer", [
    ("abca?a=", "002"),   # a at 1st and 4th place
    ("bbb?c=", "000"),    # no c at all
    ("dddd?d=", "004"),   # every symbol is the asked one
    ("abcd?b=", "001"),
    ("a?a=", "001"),
    ("cadcab?c=", "002"),
])
def test_hand_worked_instances_are_what_the_generator_answers(prompt, answer):
    """Draw until the generator produces ``prompt`` (at most 4^7 prompts at these sizes), then
    compare with the count worked out by hand."""
    task, size = get_task("counting"), prompt.index("?")
    rng = random.Random(0)
    for _ in range(200_000):
        example = task.example(size, rng)
        if example.prompt == prompt:
            assert example.answer == answer
            assert example.target == answer + "."
            return
    pytest.fail(f"counting never drew {prompt!r}")


@pytest.mark.parametrize("size", SIZES)
def test_answer_is_an_independent_count_and_sizes_are_symbols(size):
    for e in instances(size):
        match = re.fullmatch(r"([abcd]+)\?([abcd])=", e.prompt)
        assert match and len(match.group(1)) == size and len(e.prompt) == size + 3
        counted = sum(1 for symbol in match.group(1) if symbol == match.group(2))
        assert re.fullmatch(r"[0-9]{3}", e.answer) and int(e.answer) == counted


def test_counts_vary_and_zero_occurs():
    answers = {e.answer for e in instances(7, count=400)}
    assert "000" in answers and len(answers) >= 5


def test_sizes_are_bounded_by_three_digit_answers():
    task = get_task("counting")
    assert task.size_unit == "symbols" and task.max_size == 999 and task.min_size == 1
    for bad in (0, 1000, -1, 2.0, True):
        with pytest.raises(InvalidArgument, match="size of a counting instance"):
            task.example(bad, random.Random(0))


def test_deterministic_by_seed_and_seeds_differ():
    task = get_task("counting")
    assert instances(20, seed=3) == instances(20, seed=3)
    assert instances(20, seed=3) != instances(20, seed=4)
    assert eval_examples(task, 20, 16, seed=1) == eval_examples(task, 20, 16, seed=1)
    assert eval_examples(task, 20, 16, seed=1) != eval_examples(task, 20, 16, seed=2)


def test_no_answer_leakage():
    """The prompt holds no digit (the answer is digits only), and the training batch scores the
    answer and END alone, the first of them read from the prompt's last byte."""
    import torch

    from posenc.lab.experiments.lengthgen import encode_training_batch
    from posenc.lab.train import IGNORE_INDEX

    for e in instances(30, count=100):
        assert not re.search(r"[0-9]", e.prompt)
    examples = instances(5, count=8)
    _, targets = encode_training_batch(examples)
    for row, e in enumerate(examples):
        scored = targets[row] != IGNORE_INDEX
        assert bytes(targets[row][scored].tolist()).decode() == e.target
        assert int(torch.nonzero(scored)[0]) == len(e.prompt) - 1


def test_catalogue_lists_counting_outside_the_default_run_with_rand_only():
    from posenc.lab.experiments import lengthgen

    entry = {entry["task"]: entry for entry in lengthgen.task_catalogue()}["counting"]
    assert not entry["in_default"] and "counting" not in lengthgen.DEFAULT_TASKS
    assert entry["suffixes"] == ["+rand"]
    assert entry["size_unit"] == "symbols" and entry["train_size"] == 16
    assert "CoPE" in entry["source"] and "Golovneva" in entry["source"]
    assert "3 digits" in entry["answer"] and entry["prompt"]
    assert list(TASKS)[-1] == "counting"


@pytest.mark.parametrize("suffix", ["coupled", "abacus"])
def test_coupled_and_abacus_rows_are_refused(suffix):
    from posenc.lab.experiments.lengthgen import preset_config

    with pytest.raises(ValueError, match=rf"\+{suffix} positions have no meaning for the task 'counting'"):
        preset_config("default", tasks=("counting",), encodings=(f"rope+{suffix}",))
    preset_config("default", tasks=("counting",), encodings=("rope+rand",))


def test_lengthgen_runs_counting_with_cope_and_fox_end_to_end(tmp_path, capsys):
    from test_tasks_recall import tiny_lengthgen

    summary = tiny_lengthgen(tmp_path, capsys, "counting", "cope,fox,rope")
    settings = summary["config"]["task_settings"]["counting"]
    assert settings["size_unit"] == "symbols" and settings["eval_sizes"] == [2, 4, 6, 8, 12, 16]
    assert set(summary["results"]["counting"]) == {"cope", "fox", "rope"}
    for row in ("cope", "fox", "rope"):
        cells = summary["results"]["counting"][row]["eval"]
        assert list(cells) == [str(s) for s in settings["eval_sizes"]]
        assert all(0 <= cell["accuracy"] <= 1 for cell in cells.values())
