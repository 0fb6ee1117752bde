"""The recall and formal-language tasks of issue 23 item 3 (MQAR, Deletang et al.'s parity,
modular arithmetic, cycle navigation, bucket sort, duplicate string and missing duplicate,
RULER's multi-key needle and variable tracking): answers checked against hand-worked instances
and an independent reading of each prompt (Python's eval, regular expressions, counting), sizes
in the stated unit, determinism from the seed, the answer never given in the prompt, and their
place in the catalogue (listed, not in the default run, +rand only)."""

import random
import re

import pytest

from posenc.lab.experiments.tasks import DEPTHS, TASKS, Passkey, eval_examples, get_task

NEW = ("mqar", "parity", "modular", "cycle", "bucket_sort", "duplicate", "missing", "multikey", "vartrack")
SIZES = (1, 2, 7, 20, 64)


def instances(name, size, count=40, seed=0):
    task = get_task(name)
    rng = random.Random(seed)
    return [task.example(size, rng) for _ in range(count)]


# ---- hand-worked instances: each answer worked out on paper from the fixed prompt


@pytest.mark.parametrize("name, prompt, answer", [
    ("parity", "0110=", "0"), ("parity", "1=", "1"), ("parity", "1011001=", "0"), ("parity", "111=", "1"),
    ("modular", "1+2*3=", "2"), ("modular", "1-1-1=", "4"), ("modular", "0*1+4=", "4"), ("modular", "3-4*2=", "0"), ("modular", "4*4*4=", "4"),
    ("cycle", "rlsll=", "3"), ("cycle", "rrrl=", "2"), ("cycle", "rrrrr=", "0"), ("cycle", "l=", "4"),
    ("bucket_sort", "31402=", "01234"), ("bucket_sort", "4410=", "0144"),
    ("duplicate", "abb=", "abbabb"),
    ("missing", "a_aaba=", "b"), ("missing", "ab_aba=", "a"), ("missing", "_bab=", "a"), ("missing", "abba_bba=", "a"),
    ("mqar", "ab3?ab=", "3"), ("mqar", "zq0?zq=", "0"),
])
def test_hand_worked_instances_are_what_the_generator_answers(name, prompt, answer):
    """Draw until the generator produces ``prompt`` (a few thousand prompts at these sizes),
    then compare with the answer worked out by hand."""
    task = get_task(name)
    size = {"parity": len(prompt) - 1, "modular": len(prompt) // 2, "cycle": len(prompt) - 1,
            "bucket_sort": len(prompt) - 1, "duplicate": len(prompt) - 1, "missing": (len(prompt) - 1) // 2,
            "mqar": 1}[name]
    rng = random.Random(0)
    for _ in range(200_000):
        example = task.example(size, rng)
        if example.prompt == prompt:
            assert example.answer == answer
            return
    pytest.fail(f"{name} never drew {prompt!r}")


# ---- every instance against an independent reading of its prompt


@pytest.mark.parametrize("size", SIZES)
def test_parity_cycle_sort_duplicate(size):
    for e in instances("parity", size):
        assert re.fullmatch(r"[01]+=", e.prompt) and len(e.prompt) == size + 1
        assert e.answer == ("1" if sum(map(int, e.prompt[:-1])) % 2 else "0")
    for e in instances("cycle", size):
        assert re.fullmatch(r"[lsr]+=", e.prompt) and len(e.prompt) == size + 1
        assert int(e.answer) == (e.prompt.count("r") - e.prompt.count("l")) % 5
    for e in instances("bucket_sort", size):
        assert re.fullmatch(r"[0-4]+=", e.prompt) and len(e.prompt) == size + 1
        assert e.answer == "".join(d * e.prompt.count(d) for d in "01234")
    for e in instances("duplicate", size):
        assert re.fullmatch(r"[ab]+=", e.prompt) and len(e.prompt) == size + 1
        assert e.answer == e.prompt[:-1] * 2


@pytest.mark.parametrize("size", SIZES)
def test_modular_arithmetic_is_python_arithmetic_mod_5(size):
    operators = set()
    for e in instances("modular", size):
        assert re.fullmatch(r"[0-4]([-+*][0-4])*=", e.prompt) and len(e.prompt) == 2 * size
        assert int(e.answer) == eval(e.prompt[:-1]) % 5  # Python's precedence: * first
        operators |= set(e.prompt[1:-1:2])
    assert size < 7 or operators == set("+-*")


@pytest.mark.parametrize("size", SIZES)
def test_missing_duplicate_answer_fills_the_hole(size):
    for e in instances("missing", size):
        body = e.prompt[:-1]
        assert len(body) == 2 * size and body.count("_") == 1 and set(body) <= set("ab_")
        hole = body.index("_")
        mirror = hole + size if hole < size else hole - size  # the same symbol in the other copy
        assert e.answer == body[mirror]
        filled = body.replace("_", e.answer)
        assert filled[:size] == filled[size:]


@pytest.mark.parametrize("size", SIZES)
def test_mqar_answers_each_queried_key_with_its_value(size):
    for e in instances("mqar", size):
        match = re.fullmatch(r"((?:[a-z]{2}\d)+)\?((?:[a-z]{2})+)=", e.prompt)
        assert match
        pairs = re.findall(r"([a-z]{2})(\d)", match[1])
        queries = re.findall(r"[a-z]{2}", match[2])
        table = dict(pairs)
        assert len(pairs) == size and len(table) == size  # size counts pairs; keys distinct
        assert len(queries) == (size + 1) // 2 and len(set(queries)) == len(queries)
        assert e.answer == "".join(table[q] for q in queries)


def test_mqar_refuses_more_pairs_than_keys():
    assert len(instances("mqar", 676, count=1)[0].prompt) > 676 * 3
    with pytest.raises(ValueError, match="size of a mqar instance must be at most 676, got 677"):
        get_task("mqar").example(677, random.Random(0))


@pytest.mark.parametrize("size", [0, 1, 40, 300])
def test_multikey_needle_answer_is_the_asked_keys_value(size):
    task = get_task("multikey")
    rng = random.Random(2)
    for depth in DEPTHS:
        e = task.example(size, rng, depth)
        needles = re.findall(r" key ([a-z]{2}) (\d{5})\. ", e.prompt)
        asked = re.fullmatch(r".* key ([a-z]{2})\? ", e.prompt, re.DOTALL)[1]
        assert len(needles) == 4 and len(dict(needles)) == 4 and dict(needles)[asked] == e.answer
        haystack = re.sub(r" key [a-z]{2} \d{5}\. ", "", e.prompt[: -len(" key ab? ")])
        assert haystack == (Passkey.FILLER * 10)[:size]  # size counts filler bytes
        assert e.depth == depth
    assert [e.depth for e in eval_examples(task, 16, 10, seed=0)] == [*DEPTHS, *DEPTHS]


def test_multikey_asked_needle_sits_at_its_depth():
    task = get_task("multikey")
    for seed in range(30):
        e = task.example(100, random.Random(seed), 0.5)
        asked = e.prompt[-len(" key ab? "):][5:7]
        needle = f" key {asked} {e.answer}. "
        before = e.prompt[: e.prompt.index(needle)]
        filler_before = re.sub(r" key [a-z]{2} \d{5}\. ", "", before)
        assert len(filler_before) == 50


def resolve_chains(prompt):
    """An independent reading of a variable-tracking prompt: each name's value, by following
    the assignments in order."""
    value = {}
    for name, source in re.findall(r" ([a-z]{2})=([a-z]{2}|\d{5})\. ", prompt):
        value[name] = value.get(source, source)
    return value


@pytest.mark.parametrize("size", [0, 1, 40, 300])
def test_variable_tracking_answer_is_the_chain_holding_the_value(size):
    for e in instances("vartrack", size):
        value = resolve_chains(e.prompt)
        asked = re.fullmatch(r".* =(\d{5})\? ", e.prompt, re.DOTALL)[1]
        assert len(value) == 8 and all(v.isdigit() for v in value.values())  # every name resolved in order
        holders = [name for name in value if value[name] == asked]  # in assignment order
        assert e.answer == "".join(holders) and len(holders) == 4
        assert len(set(value.values())) == 2  # a second chain, another value: the distractor
        haystack = re.sub(r" [a-z]{2}=(?:[a-z]{2}|\d{5})\. ", "", e.prompt[: -len(" =12345? ")])
        assert haystack == (Passkey.FILLER * 10)[:size]


def test_variable_tracking_hand_worked():
    prompt = " ab=36937.  xq=50112. The cd=ab. gr ef=xq.  gh=cd. ass ij=gh.  kl=ef.  mn=kl.  =36937? "
    value = resolve_chains(prompt)
    assert "".join(n for n in value if value[n] == "36937") == "abcdghij"
    assert "".join(n for n in value if value[n] == "50112") == "xqefklmn"


# ---- properties shared by the new tasks


@pytest.mark.parametrize("name", NEW)
def test_same_seed_same_instances_other_seed_others(name):
    size = max(7, get_task(name).min_size)
    assert instances(name, size) == instances(name, size)
    assert instances(name, size) != instances(name, size, seed=1)
    task = get_task(name)
    assert eval_examples(task, 9, 20, seed=3) == eval_examples(task, 9, 20, seed=3)
    assert eval_examples(task, 9, 20, seed=3) != eval_examples(task, 9, 20, seed=4)


@pytest.mark.parametrize("name", NEW)
def test_the_answer_is_a_target_only(name):
    """The prompt ends with its question mark, and the training batch scores the answer and END
    alone: no answer byte is an input the model reads before predicting it."""
    import torch

    from posenc.lab.experiments.lengthgen import encode_training_batch
    from posenc.lab.train import IGNORE_INDEX

    examples = instances(name, 5, count=8)
    assert all(e.prompt.endswith(("=", "? ")) for e in examples)
    _, targets = encode_training_batch(examples)
    for row, e in enumerate(examples):
        scored = targets[row] != IGNORE_INDEX
        assert bytes(targets[row][scored].tolist()).decode() == e.target
        first = int(torch.nonzero(scored)[0])
        assert first == len(e.prompt) - 1  # the first scored position reads the prompt's last byte


def test_answers_need_the_prompt_not_the_question_alone():
    """Leakage: what follows the last question marker holds no answer byte for the recall tasks
    (MQAR's queries are keys, never values; the needle question names a key; vartrack's a value)."""
    for e in instances("mqar", 20):
        assert not set(e.prompt.split("?")[1]) & set(e.answer)
    for e in instances("multikey", 30):
        assert e.answer not in e.prompt[-len(" key ab? "):]
    for e in instances("vartrack", 30):
        assert not set(e.prompt[-len(" =12345? "):]) & set(e.answer)


def test_catalogue_lists_the_new_tasks_outside_the_default_run_with_rand_only():
    from posenc.lab.experiments import lengthgen

    entries = {entry["task"]: entry for entry in lengthgen.task_catalogue()}
    assert lengthgen.DEFAULT_TASKS == ("copy", "reverse", "addition", "flipflop", "passkey")
    assert lengthgen.preset_config("default").tasks == lengthgen.DEFAULT_TASKS
    for name in NEW:
        entry = entries[name]
        assert not entry["in_default"] and entry["suffixes"] == ["+rand"]
        assert entry["size_unit"] and entry["prompt"] and entry["answer"] and entry["source"]
        assert entry["train_size"] >= TASKS[name].min_size
    assert entries["mqar"]["size_unit"] == "key-value pairs" and "Zoology" in entries["mqar"]["source"]
    assert all("Deletang" in entries[n]["source"] for n in ("parity", "modular", "cycle", "bucket_sort", "duplicate", "missing"))
    assert all("RULER" in entries[n]["source"] for n in ("multikey", "vartrack"))


@pytest.mark.parametrize("suffix", ["coupled", "abacus"])
def test_coupled_and_abacus_rows_are_refused_on_the_new_tasks(suffix):
    from posenc.lab.experiments.lengthgen import preset_config

    for name in NEW:
        with pytest.raises(ValueError, match=rf"\+{suffix} positions have no meaning for the task '{name}'"):
            preset_config("default", tasks=(name,), encodings=(f"rope+{suffix}",))
    preset_config("default", tasks=NEW, encodings=("rope+rand",))  # +rand is accepted everywhere


def test_a_size_past_mqars_keys_is_refused_before_any_run():
    from posenc.lab.experiments.lengthgen import preset_config

    with pytest.raises(ValueError, match="mqar's largest size 800 is past its largest instance"):
        preset_config("default", tasks=("mqar",), train_size=200)


def tiny_lengthgen(tmp_path, capsys, tasks: str, encodings: str) -> dict:
    """results.json of a 2-step lengthgen run of a 1-layer, 16-wide model at N = 4."""
    import json

    from posenc.lab.cli import main

    out = tmp_path / "out"
    args = ["lengthgen", "--tasks", tasks, "--encodings", encodings, "--steps", "2", "--eval-instances", "4",
            "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2", "--train-size", "4", "--threads", "1",
            "--workers", "1", "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err
    return json.loads((out / "results.json").read_text())


def test_lengthgen_runs_new_tasks_end_to_end(tmp_path, capsys):
    summary = tiny_lengthgen(tmp_path, capsys, "mqar,vartrack", "rope,alibi+rand")
    settings = summary["config"]["task_settings"]
    assert settings["mqar"]["size_unit"] == "key-value pairs" and settings["mqar"]["eval_sizes"] == [2, 4, 6, 8, 12, 16]
    assert settings["vartrack"]["size_unit"] == "filler bytes"
    for task in ("mqar", "vartrack"):
        for row in ("rope", "alibi+rand"):
            cells = summary["results"][task][row]["eval"]
            assert list(cells) == [str(s) for s in settings[task]["eval_sizes"]]
            assert all(0 <= cell["accuracy"] <= 1 for cell in cells.values())
