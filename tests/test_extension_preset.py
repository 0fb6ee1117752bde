"""``posenc extrapolate --preset extension`` (issue 26, item 5): its contents, YaRN's ramp with
pairs on both sides at its head_dim and L, the zero-shot passkey map against an induction
oracle, and the whole preset at toy size through the CLI."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from posenc.errors import InvalidArgument
from posenc.lab import cli
from posenc.lab.experiments.extrapolation import preset_config
from posenc.lab.experiments.lm import passkey_map, passkey_prompts
from posenc.lab.experiments.extension_methods import BRANCH_METHODS, _extension_encoding
from posenc.lab.experiments.rope_extension import extension_rows
from posenc.lab.experiments.tasks import DEPTHS
from posenc.rope import EXTENSION_METHODS, RoPE, extension_scaling, rope_frequencies

WORDS = "the of and to in is was for on that with as by at from it an be this which or are have".split()


def test_preset_contents():
    config = preset_config("extension")
    assert config.seeds == (0, 1, 2) and config.encodings == ("rope",)
    assert config.model.head_dim >= 32
    L = config.train_len
    assert config.eval_lengths == [L // 2, L, 2 * L, 4 * L, 8 * L, 16 * L]
    assert config.extension_methods == EXTENSION_METHODS + BRANCH_METHODS
    # DroPE's recalibration and the YaRN fine-tune: the same extra steps
    assert config.drope_steps == config.finetune_steps > 0 and config.drope_qk_norm
    assert config.passkey_instances > 0 and config.extension_factor == 16
    rows = extension_rows(config)
    methods = EXTENSION_METHODS + BRANCH_METHODS
    assert rows[:len(methods)] == [f"rope+{m}" for m in methods]
    assert not any(f"rope+{m}+ft" in rows for m in BRANCH_METHODS)  # training-free: no fine-tune rows
    assert {"rope+ft", "rope+yarn+ft", "rope+drope", "rope+drope+qknorm", "nope+long"} <= set(rows)


def test_preset_puts_yarn_pairs_on_both_sides_of_the_ramp():
    """YaRN (Peng et al. 2023, eq. 16-18): pair i turns r_i = L theta_i / 2 pi times in L;
    r_i > beta_fast = 32 keeps theta_i, r_i < beta_slow = 1 divides it by s, between them a ramp.
    At the preset's head_dim and L both kept and divided pairs exist; checked against posenc's
    frequencies at s = 16."""
    config = preset_config("extension")
    d, L, s = config.model.head_dim, config.train_len, 16.0
    theta = [10000.0 ** (-2 * i / d) for i in range(d // 2)]
    turns = [L * t / (2 * math.pi) for t in theta]
    kept = [i for i, r in enumerate(turns) if r > 32]
    divided = [i for i, r in enumerate(turns) if r < 1]
    assert kept and divided
    inv_freq, _ = rope_frequencies(d, scaling=extension_scaling("yarn", s, L), seq_len=int(s * L))
    inv_freq = inv_freq.double().tolist()
    for i in kept:
        assert math.isclose(inv_freq[i], theta[i], rel_tol=1e-6)
    for i in divided:
        assert math.isclose(inv_freq[i], theta[i] / s, rel_tol=1e-6)


def test_scalings_are_ropes_and_branch_maps_have_the_references_windows_scaled_to_L():
    rope = RoPE(32)
    for method in EXTENSION_METHODS:
        built = _extension_encoding(rope, method, {"factor": 4.0, "original_max_position_embeddings": 64})
        assert isinstance(built, RoPE) and built.head_dim == 32
    assert _extension_encoding(rope, "yarn", {"factor": 1.0, "original_max_position_embeddings": 64}).scaling is None
    # the references' Llama 2 defaults (L0 = 4096) at L0 = 256: windows x 1/16, by hand
    expected = {
        "self_extend": {"group_size": 8, "neighbor_window": 64},
        "rerope": {"window": 32, "training_length": 256},
        "leaky_rerope": {"window": 32, "scaling_factor": 16, "training_length": 256},
        "dca": {"chunk_size": 192, "local_size": 16},
        "string": {"shifted_offset": 84, "local_value": 8},  # int(0.33 * 256)
        "lm_infinite": {"local_branch": 256, "global_branch": 6},  # 100 / 16 = 6.25
        "streaming_llm": {"start_size": 4, "recent_size": 32},
        "windowed_yarn": {"factor": 4.0, "window": 224, "training_length": 256},  # the row's factor at this length
    }
    assert set(expected) == set(BRANCH_METHODS)
    for method, fields in expected.items():
        built = _extension_encoding(rope, method, {"factor": 4.0, "original_max_position_embeddings": 256})
        assert built.branched and built.method == method and built.rope is rope
        assert {name: getattr(built.map, name) for name in fields} == fields
    for method in BRANCH_METHODS:
        preset_config("quick", encodings=("rope",), extension_methods=(method,))  # accepted
    with pytest.raises(InvalidArgument, match="unknown method"):
        preset_config("quick", encodings=("rope",), extension_methods=("self_extnd",))


# -- the passkey map ---------------------------------------------------------------------------
class InductionOracle(nn.Module):
    """Predicts at each position the byte that followed the latest earlier occurrence of the
    last ``span`` bytes (a perfect induction head), else byte 0: it finds every key."""

    def __init__(self, span: int = 5) -> None:
        super().__init__()
        self.span = span
        self.anchor = nn.Parameter(torch.zeros(()))  # a device for passkey_map to read

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*x.shape, 256)
        for b, row in enumerate(x.tolist()):
            for t in range(len(row)):
                guess = 0
                for s in range(t - 1, self.span - 2, -1):
                    if row[s - self.span + 1:s + 1] == row[t - self.span + 1:t + 1] and s + 1 <= t:
                        guess = row[s + 1]
                        break
                logits[b, t, guess] = 1.0
        return logits


class Blind(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return torch.zeros(*x.shape, 256)


def test_passkey_prompts_hold_the_key_at_its_depth():
    rng = random.Random(0)
    for length in (40, 97):
        for depth in DEPTHS:
            prompts, key_at = passkey_prompts(length, depth, 3, rng)
            assert prompts.shape == (3, length) and key_at == length - 5
            for row in prompts.tolist():
                text = bytes(row).decode()
                key = text[key_at:]
                assert key.isdigit() and text[:key_at].endswith(" key ")
                first = text.index(f" key {key}. ")
                room = length - len(f" key {key}. ") - len(" key ") - 5
                assert first == round(depth * room)
    with pytest.raises(InvalidArgument, match="shorter than its fixed 22 bytes"):
        passkey_prompts(21, 0.5, 1, rng)


def test_passkey_map_scores_an_induction_oracle_one_and_a_blind_model_zero():
    oracle = passkey_map(InductionOracle(), [40, 64], 2, seed=0)
    assert oracle == {str(n): {str(d): 1.0 for d in DEPTHS} for n in (40, 64)}
    blind = passkey_map(Blind(), [40], 2, seed=0)
    assert all(a == 0.0 for a in blind["40"].values())


# -- the preset at toy size --------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    rng = random.Random(0)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(1200))
    path = tmp_path_factory.mktemp("corpus") / "tiny.txt"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def toy_run(corpus_file, tmp_path_factory):
    """The preset's every row and length (L/2 .. 16L), shrunk: one seed, a few steps."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("extension")
    args = ["extrapolate", "--preset", "extension", "--corpus", str(corpus_file), "--seeds", "0", "--train-len", "64",
            "--steps", "4", "--batch-size", "2", "--d-model", "32", "--layers", "1", "--heads", "1",
            "--eval-tokens", "1024", "--finetune-steps", "2", "--finetune-factor", "2",
            "--drope-steps", "2", "--passkey-instances", "1", "--extension-factor", "4", "--out", str(out)]
    return cli.main(args), out


def test_toy_preset_runs_every_row(toy_run, capsys):
    code, out = toy_run
    assert code == 0
    import json

    summary = json.loads((out / "results.json").read_text())
    results = summary["results"]
    rows = ["rope", *[f"rope+{m}" for m in EXTENSION_METHODS + BRANCH_METHODS], "rope+ft",
            *[f"rope+{m}+ft" for m in EXTENSION_METHODS],
            "rope+drope", "rope+drope+qknorm", "nope+long"]
    assert list(results) == rows
    for row in rows:
        assert set(results[row]["eval"]) == set(results[row]["passkey"]) == {"32", "64", "128", "256", "512", "1024"}
        assert all(0.0 <= a <= 1.0 for cells in results[row]["passkey"].values() for a in cells.values())
    plain = results["rope"]["eval"]
    # a scaling fixed for 4L serves the short texts too: the static ones change L/2 and L ...
    for method in ("linear", "ntk", "yarn", "llama3"):
        assert results[f"rope+{method}"]["eval"]["32"]["loss"] != plain["32"]["loss"]
    # ... the dynamic ones follow the length: at n <= L they are the plain RoPE, exactly
    for method in ("dynamic", "dynamic_yarn"):
        for n in ("32", "64"):
            assert results[f"rope+{method}"]["eval"][n]["loss"] == plain[n]["loss"]
        assert results[f"rope+{method}"]["eval"]["1024"]["loss"] != plain["1024"]["loss"]
    assert summary["config"]["eval_factors"] == [0.5, 1, 2, 4, 8, 16]
    assert summary["config"]["drope_steps"] == 2 and summary["config"]["passkey_instances"] == 1


def test_toy_preset_writes_its_reading(toy_run):
    """summary.md: every row's bits per byte at each length as results.json has them, its
    change against rope, and the passkey means over depths."""
    import json
    import math

    code, out = toy_run
    assert code == 0
    results = json.loads((out / "results.json").read_text())["results"]
    assert (out / "extension.png").stat().st_size > 10_000  # the comparison's figure, beside extrapolation.png
    text = (out / "summary.md").read_text()
    bits = text.split("## Bits per byte")[1].split("##")[0]
    lines = {line.split("|")[1].strip(): line for line in bits.splitlines() if line.startswith("| rope") or
             line.startswith("| nope")}
    assert set(lines) == set(results)
    for row, result in results.items():
        cells = [c.strip() for c in lines[row].split("|")[2:-1]]
        assert len(cells) == 6
        for cell, n in zip(cells, ("32", "64", "128", "256", "512", "1024")):
            assert float(cell) == pytest.approx(result["eval"][n]["loss"] / math.log(2), abs=6e-4)
    change = text.split("## Against plain RoPE")[1].split("##")[0]
    yarn = next(line for line in change.splitlines() if line.startswith("| rope+yarn |"))
    first = float(yarn.split("|")[2])
    expected = (results["rope+yarn"]["eval"]["32"]["loss"] - results["rope"]["eval"]["32"]["loss"]) / math.log(2)
    assert first == pytest.approx(expected, abs=1.1e-3)
