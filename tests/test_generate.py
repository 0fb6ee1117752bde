"""TransformerLM.generate (greedy and sampling, with the KV cache) and `posenc generate`."""

import pytest
import torch

from posenc.lab.cli import main
from posenc.lab.data import decode_bytes, encode_text
from posenc.lab.model import TransformerLM
from test_positions_contract import DYNAMIC, NAMES, tiny_lm


def greedy_without_cache(model: TransformerLM, tokens: torch.Tensor, steps: int) -> torch.Tensor:
    """The reference: re-run the full forward pass on the whole text at every step, take the argmax."""
    for _ in range(steps):
        tokens = torch.cat((tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)), dim=1)
    return tokens


ENCODINGS = [(name, {}) for name in NAMES] + [("rope", dict(scaling=DYNAMIC))]


@pytest.mark.parametrize("name, kwargs", ENCODINGS, ids=[n if not k else f"{n}-dynamic" for n, k in ENCODINGS])
def test_greedy_generate_equals_argmax_of_full_passes(name, kwargs):
    model = tiny_lm(name, **kwargs)
    prompt = torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        expected = greedy_without_cache(model, prompt, 12)
    torch.testing.assert_close(model.generate(prompt, 12), expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_left_padded_batch_generates_each_row_as_if_alone(name):
    model = tiny_lm(name)
    rows = [torch.randint(0, 256, (n,)) for n in (6, 2)]
    tokens = torch.zeros(2, 6, dtype=torch.long)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    for b, row in enumerate(rows):
        tokens[b, 6 - len(row):], padding[b, 6 - len(row):] = row, True
    batched = model.generate(tokens, 8, padding_mask=padding)
    for b, row in enumerate(rows):
        alone = model.generate(row.unsqueeze(0), 8)
        assert batched[b, 6:].tolist() == alone[0, len(row):].tolist()


def test_sampling_is_reproducible_with_a_seeded_generator():
    model = tiny_lm("rope")
    prompt = torch.randint(0, 256, (2, 4))

    def sample(seed, **kwargs):
        return model.generate(prompt, 20, temperature=1.0, generator=torch.Generator().manual_seed(seed), **kwargs)

    assert torch.equal(sample(3), sample(3))
    assert not torch.equal(sample(3), sample(4))
    assert torch.equal(sample(5, top_k=7), sample(5, top_k=7))
    # top_k = 1 keeps only the argmax: sampling becomes greedy
    assert torch.equal(model.generate(prompt, 10, top_k=1, generator=torch.Generator().manual_seed(0)), model.generate(prompt, 10))


def test_sampled_first_token_follows_the_tempered_top_k_distribution():
    """Draws of one token from a batch of identical prompts against softmax(logits / T)
    restricted to the k largest, computed here from the full forward pass."""
    model = tiny_lm("alibi")
    prompt = torch.randint(0, 256, (1, 4))
    temperature, top_k, draws = 0.5, 4, 4000
    with torch.no_grad():
        logits = model(prompt)[0, -1].double()
    top = torch.topk(logits, top_k).indices
    expected = torch.softmax(logits[top] / temperature, 0)
    out = model.generate(prompt.expand(draws, -1), 1, temperature=temperature, top_k=top_k,
                         generator=torch.Generator().manual_seed(0))[:, -1]
    assert set(out.tolist()) <= set(top.tolist())
    observed = torch.stack([(out == t).double().mean() for t in top])
    # binomial standard error <= sqrt(0.25 / 4000) = 0.008; 0.04 is five of them
    torch.testing.assert_close(observed, expected, atol=0.04, rtol=0)


def test_generate_refuses_positions_past_a_learned_table():
    model = tiny_lm("learned")  # max_positions 64
    prompt = torch.zeros(1, 60, dtype=torch.long)
    assert model.generate(prompt, 5).shape == (1, 65)  # the last new token is read at position 63
    with pytest.raises(ValueError, match=r"max_new_tokens: .* holds 0..63"):
        model.generate(prompt, 6)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(max_new_tokens=0), ValueError, "max_new_tokens must be an integer >= 1"),
    (dict(temperature=0.0), ValueError, "temperature must be a finite number > 0"),
    (dict(temperature=-1.0), ValueError, "temperature must be a finite number > 0"),
    (dict(temperature=float("nan")), ValueError, "temperature must be a finite number > 0"),
    (dict(top_k=0), ValueError, "top_k must be an integer >= 1"),
    (dict(generator=0), TypeError, "generator must be a torch.Generator"),
    (dict(padding_mask=torch.tensor([[1, 1, 0]])), ValueError, "pad on the left only"),
    (dict(padding_mask=torch.tensor([[1, 1]])), ValueError, "padding_mask must have the shape of tokens"),
    (dict(tokens=torch.zeros(1, 0, dtype=torch.long)), ValueError, "T >= 1"),
    (dict(tokens=torch.zeros(1, 3)), TypeError, "tokens must be an integer tensor"),
])
def test_generate_bad_arguments(kwargs, error, match):
    model = tiny_lm("nope")
    args = dict(tokens=torch.zeros(1, 3, dtype=torch.long), max_new_tokens=2) | kwargs
    with pytest.raises(error, match=match):
        model.generate(args.pop("tokens"), args.pop("max_new_tokens"), **args)


# -- checkpoints and the CLI ------------------------------------------------------------------

def save_checkpoint(path, name="rope"):
    """A training checkpoint as written before checkpoint format 1, {"model": state_dict,
    "fingerprint": {"model", "encoding"}}, which from_checkpoint still reads (format 1:
    test_checkpoint.py)."""
    model = tiny_lm(name)
    torch.save({"model": model.state_dict(), "fingerprint": {"model": model.config.to_dict(), "encoding": name}}, path)
    return model


def test_from_checkpoint_rebuilds_the_same_model(tmp_path):
    model = save_checkpoint(tmp_path / "ckpt.pt", "t5")
    loaded = TransformerLM.from_checkpoint(tmp_path / "ckpt.pt")
    tokens = torch.randint(0, 256, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)


def run_cli(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_generate_prints_the_greedy_continuation(tmp_path, capsys):
    model = save_checkpoint(tmp_path / "ckpt.pt")
    code, out, err = run_cli(["generate", str(tmp_path / "ckpt.pt"), "--prompt", "def f(x):", "--max-new-tokens", "7"], capsys)
    assert code == 0, err
    prompt = encode_text("def f(x):").unsqueeze(0)
    assert out == decode_bytes(model.generate(prompt, 7)[0, prompt.shape[1]:]) + "\n"


def test_cli_generate_sampling_is_reproducible(tmp_path, capsys):
    save_checkpoint(tmp_path / "ckpt.pt")
    args = ["generate", str(tmp_path / "ckpt.pt"), "--prompt", "x", "--max-new-tokens", "30", "--temperature", "1.5", "--top-k", "50"]
    runs = [run_cli([*args, "--seed", seed], capsys) for seed in ("1", "1", "2")]
    assert all(code == 0 for code, _, _ in runs)
    assert runs[0][1] == runs[1][1] != runs[2][1]


def test_cli_generate_on_an_extrapolate_checkpoint(tmp_path, capsys):
    """The checkpoint `posenc extrapolate` writes is what `posenc generate` reads."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def function(x):\n    return x * 2 + 1\n" * 40)
    out = tmp_path / "out"
    code, _, err = run_cli(["extrapolate", "--encodings", "alibi", "--corpus", str(corpus), "--out", str(out),
                            "--train-len", "8", "--steps", "3", "--batch-size", "2", "--d-model", "16", "--layers", "1",
                            "--heads", "2", "--eval-factors", "1,2", "--eval-tokens", "32"], capsys)
    assert code == 0, err
    checkpoint = out / "checkpoints" / "alibi-seed0.pt"
    code, text, err = run_cli(["generate", str(checkpoint), "--prompt", "def ", "--max-new-tokens", "5"], capsys)
    assert code == 0, err
    model = TransformerLM.from_checkpoint(checkpoint)
    assert model.config.d_model == 16 and model.encoding.name == "alibi"
    state = torch.load(checkpoint, weights_only=True)  # plain data and tensors only
    assert state["config"] == model.config.to_dict() and state["encoding"] == {"name": "alibi", "kwargs": {}}
    prompt = encode_text("def ").unsqueeze(0)
    assert text == decode_bytes(model.generate(prompt, 5)[0, 4:]) + "\n"


@pytest.mark.parametrize("extra, match", [
    (["--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1"),
    (["--temperature", "0"], "temperature must be a finite number >= 1e-06"),
    (["--temperature", "-2"], "temperature must be a finite number >= 1e-06"),
    (["--top-k", "0"], "top_k must be an integer >= 1"),
    (["--max-new-tokens", "many"], "max-new-tokens"),
])
def test_cli_generate_bad_arguments_exit_2_in_one_line(tmp_path, capsys, extra, match):
    save_checkpoint(tmp_path / "ckpt.pt")
    code, out, err = run_cli(["generate", str(tmp_path / "ckpt.pt"), "--prompt", "a", *extra], capsys)
    assert code == 2 and out == ""
    assert err.startswith("posenc: error:") and err.count("\n") == 1 and match in err, err


def test_cli_generate_bad_checkpoints_exit_2_in_one_line(tmp_path, capsys):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    torch.save({"model": {}}, tmp_path / "nofingerprint.pt")
    save_checkpoint(tmp_path / "ok.pt")
    cases = [
        ([str(tmp_path / "missing.pt"), "--prompt", "a"], "no such file"),
        ([str(tmp_path / "junk.pt"), "--prompt", "a"], "not a readable posenc checkpoint"),
        ([str(tmp_path / "nofingerprint.pt"), "--prompt", "a"], "lacks the 'model' weights or fingerprint"),
        ([str(tmp_path / "ok.pt"), "--prompt", ""], "--prompt"),
        ([str(tmp_path / "ok.pt")], "--prompt"),
    ]
    for args, match in cases:
        code, out, err = run_cli(["generate", *args], capsys)
        assert code == 2 and out == "", args
        assert err.startswith("posenc: error:") and err.count("\n") == 1 and match in err, err


def test_checkpoint_with_mismatched_weights_is_refused(tmp_path):
    model = tiny_lm("rope")
    wrong = {**model.config.to_dict(), "d_model": 64}
    torch.save({"model": model.state_dict(), "fingerprint": {"model": wrong, "encoding": "rope"}}, tmp_path / "c.pt")
    with pytest.raises(ValueError, match="the weights do not fit its model config"):
        TransformerLM.from_checkpoint(tmp_path / "c.pt")
