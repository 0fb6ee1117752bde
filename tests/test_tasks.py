"""The synthetic tasks of `posenc lengthgen` (posenc.lab.experiments.tasks): each generator is
deterministic from its seed, its instances have the documented shape, and its answers are
right by an independent computation (Python's sorted and int arithmetic, a replay of the
flip-flop string, the key found by a regular expression)."""

import random
import re

import pytest

from posenc.lab.experiments.tasks import DEPTHS, END, TASKS, Example, Passkey, eval_examples, exact_match, get_task

SIZES = (1, 2, 5, 13, 40)


def instances(name, size, count=30, seed=0):
    task = get_task(name)
    rng = random.Random(seed)
    return [task.example(max(size, task.min_size), rng) for _ in range(count)]


@pytest.mark.parametrize("name", list(TASKS))
def test_same_seed_same_instances_other_seed_others(name):
    for size in SIZES:
        assert instances(name, size) == instances(name, size)
    assert instances(name, 13) != instances(name, 13, seed=1)
    task = get_task(name)
    assert eval_examples(task, 7, 20, seed=3) == eval_examples(task, 7, 20, seed=3)
    assert eval_examples(task, 7, 20, seed=3) != eval_examples(task, 7, 20, seed=4)


@pytest.mark.parametrize("name", list(TASKS))
def test_every_instance_of_a_size_has_one_prompt_and_answer_length(name):
    task = get_task(name)
    for size in SIZES:
        size = max(size, task.min_size)
        batch = eval_examples(task, size, 40, seed=0)
        assert {len(e.prompt) for e in batch} == {task.prompt_length(size)}
        assert len({len(e.answer) for e in batch}) == 1
        assert all(END not in e.answer and e.prompt.isascii() and e.answer.isascii() for e in batch)
        assert all(len(e.prompt) + len(e.target) == task.sequence_length(size) for e in batch)


@pytest.mark.parametrize("size", SIZES)
def test_copy_reverse_sort(size):
    for name, expected in (("copy", lambda s: s), ("reverse", lambda s: s[::-1]), ("sort", lambda s: "".join(sorted(s)))):
        for e in instances(name, size):
            letters, sep = e.prompt[:-1], e.prompt[-1]
            assert sep == "=" and len(letters) == size and set(letters) <= set("abcdefghijklmnopqrstuvwxyz")
            assert e.answer == expected(letters)


@pytest.mark.parametrize("size", SIZES)
def test_addition_is_int_addition_least_significant_digit_first(size):
    for e in instances("addition", size):
        match = re.fullmatch(r"(\d+)\+(\d+)=", e.prompt)
        assert match and len(match[1]) == len(match[2]) == size
        total = int(match[1][::-1]) + int(match[2][::-1])
        assert len(e.answer) == size + 1
        assert int(e.answer[::-1]) == total
        assert e.answer[::-1] == str(total).zfill(size + 1)


def replay_flipflop(prompt):
    """An independent reading of the flip-flop string: the bit of the last write."""
    assert prompt.endswith("r") and len(prompt) % 2 == 1
    ops = [prompt[i : i + 2] for i in range(0, len(prompt) - 1, 2)]
    assert ops[0][0] == "w" and all(op[0] in "wir" and op[1] in "01" for op in ops)
    last = [op[1] for op in ops if op[0] == "w"][-1]
    assert all(op[1] == [o[1] for o in ops[:i] if o[0] == "w"][-1] for i, op in enumerate(ops) if op[0] == "r")
    return last, len(ops) + 1


@pytest.mark.parametrize("size", [2, 3, 13, 40, 200])
def test_flipflop_answer_is_the_last_written_bit(size):
    for e in instances("flipflop", size):
        answer, count = replay_flipflop(e.prompt)
        assert e.answer == answer and count == size


def test_flipflop_opcode_frequencies_are_ffl_08():
    ops = "".join(e.prompt[2:-1:2] for e in instances("flipflop", 400, count=50))
    shares = {op: ops.count(op) / len(ops) for op in "wir"}
    assert shares["i"] == pytest.approx(0.8, abs=0.01) and shares["w"] == pytest.approx(0.1, abs=0.01)


@pytest.mark.parametrize("size", SIZES)
def test_selective_copy_keeps_the_letters_in_order(size):
    for e in instances("selective_copy", size):
        assert e.prompt.endswith("=") and len(e.prompt) == 2 * size + 1 and e.prompt.count("_") == size
        assert e.answer == e.prompt[:-1].replace("_", "")


@pytest.mark.parametrize("size", [0, 1, 32, 200])
def test_passkey_hides_the_key_at_its_depth(size):
    task = get_task("passkey")
    rng = random.Random(5)
    for depth in DEPTHS:
        e = task.example(size, rng, depth)
        keys = re.findall(r" key (\d{5})\. ", e.prompt)
        assert keys == [e.answer] and e.depth == depth
        start = e.prompt.index(" key ")
        assert start == round(depth * size)  # the filler before the key
        filler = e.prompt[:start] + e.prompt[start + len(Passkey.KEY_SENTENCE.format(key=e.answer)):-len(Passkey.QUESTION)]
        assert filler == (Passkey.FILLER * 10)[:size]
        assert e.prompt.endswith(Passkey.QUESTION)
    depths = [e.depth for e in eval_examples(task, 16, 10, seed=0)]
    assert depths == [*DEPTHS, *DEPTHS]


def test_exact_match_counts_a_partial_answer_as_wrong():
    e = Example("abc=", "abc")
    assert exact_match("abc.", e) and exact_match("abc.xyz", e)  # what follows the end marker is not read
    assert not exact_match("ab.", e)  # a prefix of the answer
    assert not exact_match("abc", e)  # never stops
    assert not exact_match("abcd.", e)  # too long
    assert not exact_match("abd.", e) and not exact_match("", e)


def test_every_task_has_its_default_setting():
    from posenc.lab.experiments.lengthgen import TASK_SETTINGS

    assert list(TASK_SETTINGS) == list(TASKS)
    assert all(setting.train_size >= TASKS[name].min_size for name, setting in TASK_SETTINGS.items())


def test_bad_sizes_and_names_are_refused():
    with pytest.raises(ValueError, match="size of a copy instance must be an integer >= 1, got 0"):
        get_task("copy").example(0, random.Random(0))
    with pytest.raises(ValueError, match="size of a flipflop instance must be an integer >= 2"):
        get_task("flipflop").example(1, random.Random(0))
    with pytest.raises(ValueError, match="depth must be in"):
        get_task("passkey").example(8, random.Random(0), 1.5)
    with pytest.raises(ValueError, match="unknown task 'kopy'; available: copy, reverse"):
        get_task("kopy")


def test_the_catalogue_lists_every_task_with_its_unit_n_formats_and_source(capsys, monkeypatch):
    from posenc.lab.cli import console, main
    from posenc.lab.experiments import lengthgen

    catalogue = lengthgen.task_catalogue()
    assert [entry["task"] for entry in catalogue] == list(TASKS)
    for entry in catalogue:
        task = TASKS[entry["task"]]
        assert entry["size_unit"] == task.size_unit and entry["train_size"] == lengthgen.TASK_SETTINGS[task.name].train_size
        assert entry["prompt"] and entry["answer"] and entry["source"]
        assert entry["in_default"] == (task.name in lengthgen.DEFAULT_TASKS)
    suffixes = {entry["task"]: entry["suffixes"] for entry in catalogue}
    assert suffixes["addition"] == suffixes["copy"] == suffixes["reverse"] == ["+rand", "+coupled", "+abacus"]
    assert suffixes["passkey"] == suffixes["flipflop"] == suffixes["sort"] == ["+rand"]
    monkeypatch.setattr(console, "width", 250)  # one line per task
    assert main(["lengthgen", "--list"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in TASKS) and "digits per operand" in printed and "Liu et al. 2023" in printed
