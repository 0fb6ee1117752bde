"""The `auto` rule is one table, docs/fast_attention.md "The `auto` rule", and the resolver
follows it: this test reads the table (rows in order, each a device and conditions) and its
legend, builds every combination of the conditions the table speaks of, and asserts that
``_resolve_backend`` picks the backend of the first row that matches. The doc and the code
cannot drift: a row edited in the doc, or a branch edited in the code, fails here.

The conditions are evaluated here from the situation the test builds (the hooks it declares,
the grad mode it sets, ...), not by calling posenc: the test's reading of each legend line is
the independent reference.
"""

from __future__ import annotations

import importlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

import posenc
from posenc.attention import flash_attention_2
from posenc.masks import sliding_window_mask_mod

attention_module = importlib.import_module("posenc.attention")

DOC = Path(__file__).resolve().parents[1] / "docs" / "fast_attention.md"
SECTION = "### The `auto` rule"


@dataclass(frozen=True)
class Row:
    number: int
    device: str
    conditions: tuple[tuple[tuple[bool, str], ...], ...]  # all of (any of ((negated, name), ...))
    backend: str


def markdown_tables(text: str) -> list[list[list[str]]]:
    """The section's tables, each a list of rows of stripped cells, header and rule dropped."""
    tables, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            tables.append(current[1:])
            current = []
    if current:
        tables.append(current[1:])
    return tables


def read_doc() -> tuple[list[Row], dict[str, str]]:
    text = DOC.read_text("utf-8")
    assert SECTION in text, f"{DOC} has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    rule, legend = markdown_tables(section)[:2]
    rows = []
    for number, device, conditions, backend in rule:
        conjuncts = []
        for conjunct in filter(None, (c.strip() for c in conditions.split(";"))):
            alternatives = []
            for alternative in conjunct.split(" or "):
                match = re.fullmatch(r"(no )?`([a-z_]+)`", alternative.strip())
                assert match, f"row {number}: cannot read the condition {alternative!r}"
                alternatives.append((match.group(1) is not None, match.group(2)))
            conjuncts.append(tuple(alternatives))
        rows.append(Row(int(number), device, tuple(conjuncts), backend.strip("`")))
    return rows, {name.strip("`"): meaning for name, meaning in legend}


@dataclass(frozen=True)
class Situation:
    """One call, as the resolver sees it."""

    device: str
    hooks: frozenset[str]  # declared by the toy encoding; None encoding: empty, no parameters
    has_encoding: bool
    learned_parameter: bool
    gates_require_grad: bool
    grad_enabled: bool
    linear: bool  # the toy's linear_bias_slopes returns slopes
    large: bool
    dtype: torch.dtype
    positions: bool
    mask: str  # "none", "tensor", "mask_mod"
    dropout: bool
    flash_attn: bool
    compiling: bool
    softcap: bool = False
    sinks: bool = False


#: The legend's conditions, read from the situation: the test's own statement of each line.
CONDITIONS = {
    "content": lambda s: "content" in s.hooks,
    "score_bias": lambda s: "score_bias" in s.hooks,
    "gate": lambda s: "gate" in s.hooks,
    "mask_hook": lambda s: "mask" in s.hooks,
    "mask": lambda s: s.mask != "none",
    "mask_mod": lambda s: s.mask == "mask_mod",
    "large_bias": lambda s: s.large,
    "learning": lambda s: s.grad_enabled and (s.learned_parameter or s.gates_require_grad),
    "linear_bias": lambda s: s.linear,
    "half": lambda s: s.dtype in (torch.float16, torch.bfloat16),
    "positions": lambda s: s.positions,
    "dropout": lambda s: s.dropout,
    "flash_attn": lambda s: s.flash_attn,
    "compiling": lambda s: s.compiling,
    "softcap": lambda s: s.softcap,
    "sinks": lambda s: s.sinks,
}

DEVICES = {
    "any": lambda device: True,
    "CPU": lambda device: device == "cpu",
    "CUDA": lambda device: device == "cuda",
    "not CUDA": lambda device: device != "cuda",
}


def expected_backend(rows: list[Row], situation: Situation) -> tuple[int, str]:
    for row in rows:
        if DEVICES[row.device](situation.device) and all(
            any(negated != CONDITIONS[name](situation) for negated, name in conjunct) for conjunct in row.conditions
        ):
            return row.number, row.backend
    raise AssertionError(f"no row of the table matches {situation}")


def toy_encoding(hooks: frozenset[str], *, learned: bool, linear: bool) -> posenc.PositionalEncoding:
    """An encoding declaring exactly ``hooks``, with or without a learned parameter, whose bias
    is or is not ALiBi's linear form: the resolver reads nothing else."""
    namespace = {"name": "toy", "hooks": hooks,
                 "linear_bias_slopes": lambda self, causal=True: torch.ones(1) if linear else None}
    encoding = type("Toy", (posenc.PositionalEncoding,), namespace)()
    if learned:
        encoding.weight = nn.Parameter(torch.zeros(1))
    return encoding


HOOK_SETS = [frozenset(c) for n in range(5) for c in itertools.combinations(("content", "score_bias", "gate", "mask"), n)]
#: (learned parameter, gates require grad, grad enabled)
LEARNING = [(False, False, True), (True, False, True), (True, False, False), (False, True, True), (False, True, False)]


def situations(device: str):
    yield from (
        Situation(device, hooks, has_encoding, learned, gates_grad, grad, linear, large, dtype, positions, mask,
                  dropout, flash, compiling, softcap, sinks)
        for has_encoding, hooks in [(False, frozenset())] + [(True, h) for h in HOOK_SETS]
        for learned, gates_grad, grad in LEARNING
        for linear in (False, True)
        for large in (False, True)
        for dtype in (torch.float32, torch.bfloat16)
        for positions in (False, True)
        for mask in ("none", "tensor", "mask_mod")
        for dropout in (False, True)
        for flash in (False, True)
        for compiling in (False, True)
        for softcap, sinks in ((False, False), (True, False), (False, True), (True, True))
        if has_encoding or not (learned or linear)
    )


def resolve(situation: Situation, encodings: dict, monkeypatch) -> str:
    encoding = encodings[(situation.hooks, situation.learned_parameter, situation.linear)] \
        if situation.has_encoding else None
    monkeypatch.setattr(flash_attention_2, "flash_attn_func", (lambda: object) if situation.flash_attn else (lambda: None))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: situation.compiling)
    gates = torch.zeros(1, 1, 1, requires_grad=situation.gates_require_grad)
    mask = {"none": None, "tensor": torch.ones(1, 1, dtype=torch.bool), "mask_mod": sliding_window_mask_mod(4)}[situation.mask]
    elements = attention_module.AUTO_BLOCKED_MIN_BIAS_ELEMENTS - (0 if situation.large else 1)
    with torch.set_grad_enabled(situation.grad_enabled):
        return attention_module._resolve_backend(
            "auto", encoding, elements, torch.device(situation.device), gates, causal=True, dtype=situation.dtype, mask=mask,
            dropout_p=0.1 if situation.dropout else 0.0, default_positions=not situation.positions,
            softcap=30.0 if situation.softcap else None, sinks=torch.zeros(1) if situation.sinks else None,
        )


def test_the_doc_table_reads_and_its_legend_is_the_tests():
    rows, legend = read_doc()
    assert [row.number for row in rows] == list(range(1, len(rows) + 1))
    assert set(legend) == set(CONDITIONS), "the legend and the test's conditions differ"
    used = {name for row in rows for conjunct in row.conditions for _, name in conjunct}
    assert used <= set(legend), f"conditions used but not in the legend: {used - set(legend)}"
    assert {row.device for row in rows} <= set(DEVICES)
    assert {row.backend for row in rows} <= set(attention_module.BACKENDS) - {"auto"}


@pytest.mark.parametrize("device", ["cpu", "cuda", "mps"])
def test_the_resolver_follows_the_doc_table(device, monkeypatch):
    rows, _ = read_doc()
    encodings = {(hooks, learned, linear): toy_encoding(hooks, learned=learned, linear=linear)
                 for hooks in HOOK_SETS for learned in (False, True) for linear in (False, True)}
    reached, wrong = set(), []
    for situation in situations(device):
        row, expected = expected_backend(rows, situation)
        reached.add(row)
        got = resolve(situation, encodings, monkeypatch)
        if got != expected:
            wrong.append((situation, f"row {row} says {expected}, the resolver picks {got}"))
    assert not wrong, f"{len(wrong)} situations disagree, e.g. {wrong[:3]}"
    on_device = {row.number for row in rows if DEVICES[row.device](device)}
    assert reached == on_device, f"rows never reached on {device}: {sorted(on_device - reached)}"


def test_a_changed_row_is_caught(monkeypatch):
    """The check can fail: with rows 6 and 8 swapped (blocked before flex on CUDA) the table
    disagrees with the resolver."""
    rows, _ = read_doc()
    by_backend = {row.backend: i for i, row in enumerate(rows) if row.device == "CUDA"}
    first_flex, blocked = min(i for i, r in enumerate(rows) if r.backend == "flex"), by_backend["blocked"]
    swapped = list(rows)
    swapped[first_flex], swapped[blocked] = rows[blocked], rows[first_flex]
    encodings = {(hooks, learned, linear): toy_encoding(hooks, learned=learned, linear=linear)
                 for hooks in HOOK_SETS for learned in (False, True) for linear in (False, True)}
    # any(): the first disagreement settles it (resolving every situation again took 8 s)
    assert any(expected_backend(swapped, s)[1] != resolve(s, encodings, monkeypatch) for s in situations("cuda"))
