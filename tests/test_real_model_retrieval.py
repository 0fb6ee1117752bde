"""The retrieval prompts of benchmarks/real_model_extension.py and their cached scoring (issue 36,
item 2), on a tiny random Llama (2 layers, std 0.2 weights: a wrong position or a wrong context
moves the logits) and a byte tokenizer; no download.

References: one forward over haystack + question + answer (the script's ``target_logits``) for
the KV-cache path that asks each question on a copy of the haystack's cache, for the plain
model, a RoPE scaling (YaRN) and a branch map (Self-Extend); tolerance from the model's own
float32 noise (its eager against its sdpa attention on the same tokens)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from conftest import load_benchmark

transformers = pytest.importorskip("transformers")

from posenc.integrations.transformers import extend_context

L0 = 64


class ByteTokenizer:
    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": list(text.encode("ascii"))}


@pytest.fixture(scope="module")
def script():
    return load_benchmark("real_model_extension")


def _model(attention: str = "sdpa"):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=L0,
                                      attn_implementation=attention)
    return _randomized(transformers.LlamaForCausalLM(config))


def _randomized(model):
    """Every parameter drawn with std 0.2 (a wrong position or context moves the logits)."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    return model.eval()


@pytest.mark.parametrize("task,depths", [("passkey", [0.3]), ("multikey", [0.0, 0.5, 0.9]), ("vartrack", [0.1, 0.6])])
def test_prompt_holds_each_needle_at_its_depth(script, task, depths):
    # 1000 bytes: the needles a small share of the text after the instruction (depth is the filler's fraction)
    haystack, trials = script.retrieval_prompt(ByteTokenizer(), task, 1000, depths, random.Random(0))
    longest = max(len(t.question) + len(t.answer) for t in trials)
    assert haystack.shape == (1, 1000 - longest) and [t.depth for t in trials] == depths
    whole = bytes(haystack[0].tolist()).decode()
    # the task's instruction first, the depths counted in the haystack after it
    assert whole.startswith(script.PREAMBLES[task]) and script.PREAMBLES[task].endswith("\n")
    text = whole[len(script.PREAMBLES[task]):]
    for trial in trials:
        answer = bytes(trial.answer).decode().strip()
        first = answer.split()[0]  # vartrack: the chain's first name holds the value
        at = text.index(f" {first} = " if task == "vartrack" else f" {answer}")
        assert abs(at / len(text) - trial.depth) < 0.1, (task, trial.depth, at / len(text))
        if task == "vartrack":
            for before, after in zip(answer.split(), answer.split()[1:]):  # each hop after the name it reads
                assert text.index(f" {after} = {before}.") > text.index(f" {before} = ")


def test_passkey_takes_one_needle_a_prompt(script):
    with pytest.raises(SystemExit, match="one needle per prompt"):
        script.retrieval_prompt(ByteTokenizer(), "passkey", 600, [0.1, 0.5], random.Random(0))
    assert script.needle_sets("passkey", [0.0, 0.5]) == [(0.0,), (0.5,)]
    assert script.needle_sets("multikey", [0.0, 0.5]) == [(0.0, 0.5)]


def _extended(model, method: str | None):
    """The model as it is, with YaRN x3, or with Self-Extend (group 4, window 16): a RoPE
    scaling and a branch map, both past L0 on 3 L0 tokens."""
    if method == "yarn":
        return extend_context(model, "yarn", 3.0, original_max_position_embeddings=L0)
    if method == "self_extend":
        return extend_context(model, "self_extend", group_size=4, neighbor_window=16)
    return model


def _reference(script, model, haystack, trial):
    """The answer's logits from one forward over haystack + question + answer."""
    ids = torch.cat([haystack, torch.tensor([trial.question + trial.answer])], dim=1)
    answer_at = ids.shape[1] - len(trial.answer)
    return torch.cat([logits for _, _, logits in script.target_logits(model, ids, answer_at)])


@pytest.mark.parametrize("method", [None, "yarn", "self_extend"])
def test_cached_questions_equal_one_forward(script, method):
    haystack, trials = script.retrieval_prompt(ByteTokenizer(), "multikey", 3 * L0, [0.0, 0.4, 0.8], random.Random(1),
                                               preamble="")  # 192 bytes: no room for the instruction
    with torch.no_grad():
        noise = (_reference(script, _model("eager"), haystack, trials[0])
                 - _reference(script, _model("sdpa"), haystack, trials[0])).abs().max().item()
    tol = max(1e-5, 4 * noise)
    model = _extended(_model(), method)
    got = script.answer_logits(model, haystack, trials)
    with torch.no_grad():
        for trial, logits in zip(trials, got):
            torch.testing.assert_close(logits, _reference(script, model, haystack, trial), atol=tol, rtol=0)
        # the check sees a wrong context: the second question asked on the first one's cache
        cache = model.model(input_ids=haystack, use_cache=True).cache
        for trial in trials[:2]:
            ids = torch.tensor([trial.question + trial.answer])
            hidden = model.model(input_ids=ids, cache=cache, use_cache=True).last_hidden_state
        stale = script._head(model, hidden[0, len(trials[1].question) - 1:-1])
        assert (stale - _reference(script, model, haystack, trials[1])).abs().max() > 100 * tol


def test_truncation_cuts_the_haystack_to_the_window(script):
    """Truncation at a window W: each answer sees at most W tokens, the longest trial exactly W
    at its last answer token; its logits those of one forward over the cut haystack + question
    + answer."""
    window = 2 * L0  # a byte tokenizer's question is about L0 tokens
    haystack, trials = script.retrieval_prompt(ByteTokenizer(), "multikey", 4 * L0, [0.0, 0.9], random.Random(2),
                                               preamble="")
    model = _model()
    longest = max(len(t.question) + len(t.answer) for t in trials)
    cut = haystack[:, -(window - longest + 1):]
    got = script.answer_logits(model, haystack, trials, window=window)
    with torch.no_grad():
        for trial, logits in zip(trials, got):
            torch.testing.assert_close(logits, _reference(script, model, cut, trial), atol=1e-5, rtol=0)
            seen = cut.shape[1] + len(trial.question) + len(trial.answer) - 1
            assert seen <= window and (seen == window) == (len(trial.question) + len(trial.answer) == longest)
        wider = _reference(script, model, haystack[:, -(window - longest + 2):], trials[0])
        assert (wider - got[0]).abs().max() > 1e-3  # one token more of context is seen


def test_rates_count_each_needle_of_each_prompt(script):
    line = {"kind": "retrieval", "model": "m", "task": "multikey", "context": 9, "boundary": 4, "method": "x",
            "prompt_version": script.PROMPT_VERSION}
    records = [dict(line, needles=[0.0, 0.5], prompt=0, found=[True, False]),
               dict(line, needles=[0.0, 0.5], prompt=1, found=[True, True]),
               dict(line, needles=[0.0, 0.5], prompt=1, method="y", found=[False, False])]
    rates = script.retrieval_rates(records)
    assert rates[("m", "multikey", 9, 4, "x", 0.0)] == [2, 2] and rates[("m", "multikey", 9, 4, "x", 0.5)] == [1, 2]
    assert rates[("m", "multikey", 9, 4, "y", 0.5)] == [0, 1]
    assert "| m | multikey | 9 | 4 | x | 2/2 | 1/2 |" in script.summarize(records)
    assert script._key(records[0]) != script._key(records[1]) != script._key(records[2])


def _gemma3(attention: str = "sdpa"):
    """A tiny Gemma 3: three sliding layers (window 8, base 1e4) and a global one (base 1e6)."""
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=4, head_dim=16, sliding_window=8, query_pre_attn_scalar=16, max_position_embeddings=L0,
        layer_types=["sliding_attention"] * 3 + ["full_attention"], attn_implementation=attention,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
    return _randomized(transformers.Gemma3ForCausalLM(config))


@pytest.mark.parametrize("method", [None, "yarn", "self_extend"])
def test_chunked_prefill_equals_one_forward_on_gemma3(script, method):
    """The script's ``prefill`` in chunks of 16 tokens through transformers' cache (the sliding
    layers keep their window of 8 only) gives one forward's hidden states, for the plain model
    and its global layers extended; a chunked prefill that drops the cache between chunks does
    not."""
    ids = torch.randint(3, 128, (1, 3 * L0), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        noise = (_gemma3("eager").model(input_ids=ids).last_hidden_state
                 - _gemma3("sdpa").model(input_ids=ids).last_hidden_state).abs().max().item()
    tol = max(1e-5, 4 * noise)
    model = _extended(_gemma3(), method)
    with torch.no_grad():
        whole = model.model(input_ids=ids, use_cache=False).last_hidden_state
        chunked, cache = script.prefill(model, ids, 16)
        torch.testing.assert_close(chunked, whole, atol=tol, rtol=0)
        assert cache.get_seq_length() == ids.shape[1]
        forgetful = torch.cat([model.model(input_ids=ids[:, s:s + 16]).last_hidden_state
                               for s in range(0, ids.shape[1], 16)], dim=1)
        assert (forgetful - whole).abs().max() > 100 * tol


class BosTokenizer(ByteTokenizer):
    """A byte tokenizer that puts a BOS (id 2) before every text, as Gemma's does."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        ids = super().__call__(text)["input_ids"]
        return {"input_ids": [2] + ids if add_special_tokens else ids}


def test_every_sequence_starts_with_the_tokenizers_bos(script):
    assert script.bos_prefix(BosTokenizer()) == [2] and script.bos_prefix(ByteTokenizer()) == []
    ids = script.text_tokens(BosTokenizer(), 50, "stdlib")
    assert ids.shape == (1, 50) and ids[0, 0] == 2 and torch.equal(ids[0, 1:], script.text_tokens(ByteTokenizer(), 49)[0])
    haystack, trials = script.retrieval_prompt(BosTokenizer(), "passkey", 400, [0.5], random.Random(0))
    assert haystack[0, 0] == 2 and haystack[0, 1] == ord("T") and haystack.shape[1] + len(trials[0].question) + len(trials[0].answer) == 400
    # a window keeps its length, its first token the BOS; a sequence that fits is left alone
    seq = torch.arange(10, 30).unsqueeze(0)
    assert script.windowed(seq, 6, [2]).tolist() == [[2, 25, 26, 27, 28, 29]]
    assert script.windowed(seq, 6, []).tolist() == [[24, 25, 26, 27, 28, 29]]
    assert script.windowed(seq, 20, [2]) is seq


def test_truncation_windows_start_with_the_bos(script):
    """Each truncation forward (loss and retrieval) reads BOS + the last tokens, as one forward
    over that window does."""
    model = _model()
    ids = torch.cat([torch.tensor([[2]]), torch.randint(3, 128, (1, 99), generator=torch.Generator().manual_seed(4))], 1)
    window = 40
    got = torch.cat([logits for _, _, logits in script.target_logits(model, ids, 60, window, 1, prefix=(2,))])
    with torch.no_grad():
        for row, target in enumerate(range(60, 100)):
            context = torch.cat([torch.tensor([[2]]), ids[:, target - window + 1:target]], 1)
            want = model(context).logits[0, -1]
            torch.testing.assert_close(got[row], want, atol=1e-5, rtol=0)
    haystack, trials = script.retrieval_prompt(BosTokenizer(), "multikey", 4 * L0, [0.0, 0.9], random.Random(2),
                                               preamble="")
    longest = max(len(t.question) + len(t.answer) for t in trials)
    cut = script.windowed(haystack, 2 * L0 - longest + 1, [2])
    assert cut[0, 0] == 2
    got = script.answer_logits(model, haystack, trials, window=2 * L0, prefix=(2,))
    with torch.no_grad():
        for trial, logits in zip(trials, got):
            torch.testing.assert_close(logits, _reference(script, model, cut, trial), atol=1e-5, rtol=0)


def test_truncation_keeps_the_prompts_instruction(script):
    """Truncation's window starts with the prompt's header (BOS and the task's instruction) and
    ends with the haystack's last tokens; its logits those of one forward over that window."""
    model = _model()
    haystack, trials = script.retrieval_prompt(BosTokenizer(), "multikey", 8 * L0, [0.0, 0.9], random.Random(3))
    header = script.retrieval_header(BosTokenizer(), "multikey")
    assert header[0] == 2 and bytes(header[1:]).decode() == script.PREAMBLES["multikey"]
    assert haystack[0, :len(header)].tolist() == header
    window, longest = 4 * L0, max(len(t.question) + len(t.answer) for t in trials)
    tail = haystack[:, -(window - longest + 1 - len(header)):]
    cut = torch.cat([torch.tensor([header]), tail], dim=1)
    got = script.answer_logits(model, haystack, trials, window=window, prefix=tuple(header))
    bos_only = script.answer_logits(model, haystack, trials, window=window, prefix=(2,))
    with torch.no_grad():
        for trial, logits, wrong in zip(trials, got, bos_only):
            want = _reference(script, model, cut, trial)
            torch.testing.assert_close(logits, want, atol=1e-5, rtol=0)
            assert (wrong - want).abs().max() > 1e-3  # the check sees a window without the instruction


def test_lines_of_an_earlier_prompt_are_kept_apart(script):
    """A line without prompt_version is the first prompt (no instruction): its key differs from
    the current prompt's and its rates are shown under their own name, never pooled."""
    line = {"kind": "retrieval", "model": "m", "task": "multikey", "context": 9, "boundary": 4, "method": "x",
            "needles": [0.0], "prompt": 0}
    old, new = dict(line, found=[False]), dict(line, found=[True], prompt_version=script.PROMPT_VERSION)
    assert script.PROMPT_VERSION == 2 and script._key(old) != script._key(new)
    rates = script.retrieval_rates([old, new])
    assert rates[("m", "multikey", 9, 4, "x", 0.0)] == [1, 1]
    assert rates[("m", "multikey (prompt v1)", 9, 4, "x", 0.0)] == [0, 1]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc only")
def test_peak_memory_counts_what_the_block_allocates(script):
    kept = torch.ones(50_000_000)  # 200 MB resident before the block: not counted
    with script.peak_memory() as memory:
        inside = torch.ones(100_000_000)  # 400 MB, freed before the block ends
        inside += 1
        del inside
    assert 380 < memory["peak_mb"] < 480, memory
    with script.peak_memory() as idle:
        pass
    assert idle["peak_mb"] < 50 and kept.sum() > 0
    # 100 KB tensors (glibc's heap, kept after a free): a second block reusing it is counted too
    pins = []
    for _ in range(2):
        with script.peak_memory() as again:
            small = [torch.ones(25_000) for _ in range(3000)]  # 300 MB
            pins.append(torch.ones(25_000))  # above them: the freed heap cannot shrink by itself
            del small
    assert 280 < again["peak_mb"] < 380, again


def test_summary_states_each_rows_cost(script):
    line = {"kind": "retrieval", "model": "m", "task": "passkey", "context": 9, "boundary": 4, "method": "x",
            "needles": [0.0], "found": [True], "prompt_version": script.PROMPT_VERSION}
    table = script.summarize([dict(line, prompt=0, seconds=10.0, peak_mb=100.0),
                              dict(line, prompt=1, seconds=20.0, peak_mb=300.0)])
    assert "| m | passkey | 9 | 4 | x | 2/2 | 15 | 300 |" in table
    loss = {"kind": "loss", "model": "smollm2", "text": "a", "context": 9, "boundary": 4, "loss_past": 1.0}
    table = script.summarize([dict(loss, method="truncation", seconds=4.0),
                              dict(loss, method="yarn", loss_past=1.5, seconds=6.0, peak_mb=12.0)])
    assert "| truncation | 1 | 1.0000 |  | +0.0000 |  | +0.0000 | 4 |  |" in table
    assert "| yarn | 1 | 1.5000 |  | +0.5000 |  | +0.5000 | 6 | 12 |" in table


@pytest.mark.parametrize("method", [None, "self_extend"])
def test_greedy_answer_is_what_full_forwards_write(script, method):
    """The answer the model writes on a copy of the haystack's cache: each token the argmax of one
    full forward over haystack + question + the tokens written so far (no cache)."""
    haystack, trials = script.retrieval_prompt(ByteTokenizer(), "multikey", 3 * L0, [0.0, 0.5], random.Random(5),
                                               preamble="")
    model = _extended(_model(), method)
    given: list = []
    script.answer_logits(model, haystack, trials, given=given)
    with torch.no_grad():
        for trial, got in zip(trials, given):
            ids = torch.cat([haystack, torch.tensor([trial.question])], dim=1)
            want = []
            for _ in trial.answer:
                nxt = int(model(ids).logits[0, -1].argmax())
                want.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            assert got == want and len(got) == len(trial.answer)
    # the check sees a wrong context: the answer written without the haystack differs
    with torch.no_grad():
        bare = script.greedy_answer(model, None, trials[0])
    assert bare != given[0]


def test_other_needle_names_an_answer_of_another_trial(script):
    a, b = script.Trial(0.0, [1], [5, 6]), script.Trial(0.5, [2], [7, 8])
    assert script.other_needle([7, 8], a, [a, b]) and not script.other_needle([5, 6], a, [a, b])
    assert not script.other_needle([7, 9], a, [a, b]) and not script.other_needle([5, 6], a, [a])
    line = {"kind": "retrieval", "model": "m", "task": "multikey", "context": 9, "boundary": 4, "method": "x",
            "needles": [0.0, 0.5], "found": [False, True], "answer_nll": [9.0, 0.5],
            "prompt_version": script.PROMPT_VERSION}
    table = script.summarize([dict(line, prompt=0, other_needle=[True, False]),
                              dict(line, prompt=1, other_needle=[False, False]), dict(line, prompt=2)])
    assert "| m | multikey | 9 | 4 | x | 0/3 (9.00, 1 other) | 3/3 (0.50, 0 other) |" in table


def test_answer_score_counts_right_tokens_and_the_answers_nll(script):
    trial = script.Trial(0.5, [1, 2], [7, 8, 9])
    logits = torch.full((3, 10), -30.0)
    logits[0, 7], logits[1, 3], logits[2, 9] = 0.0, 0.0, 0.0  # the second token wrong
    score = script.answer_score(trial, logits)
    assert score["found"] is False and score["tokens_right"] == 2
    assert score["answer_nll"] == pytest.approx(-torch.log_softmax(logits.double(), -1)[[0, 1, 2], [7, 8, 9]].sum().item(),
                                                abs=1e-4)
    logits[1, 8] = 1.0
    assert script.answer_score(trial, logits)["found"] is True
    line = {"kind": "retrieval", "model": "m", "task": "passkey", "context": 9, "boundary": 4, "method": "x",
            "needles": [0.0], "prompt": 0, "found": [True], "answer_nll": [0.5], "prompt_version": script.PROMPT_VERSION}
    assert "| m | passkey | 9 | 4 | x | 1/2 (0.75) |" in script.summarize(
        [line, dict(line, prompt=1, found=[False], answer_nll=[1.0])])


@pytest.mark.parametrize("label,window", [("windowed_yarn", 7 * L0 // 8), ("windowed_yarn_half", L0 // 2)])
def test_windowed_yarn_rows_fit_yarn_to_the_context_under_their_window(script, label, window):
    method, params = script.resolve(label, 96, L0)
    model = script.method_model(_model(), method, 96 / L0, L0, params)
    record = model.config.posenc_context_extension
    assert record["method"] == "windowed_yarn"
    assert record["params"]["factor"] == 1.5 and record["params"]["window"] == window
    assert record["params"]["training_length"] == L0 and record["params"]["attention_factor"] is None


def test_the_untempered_row_is_windowed_yarn_with_attention_factor_one(script):
    assert script.resolve("windowed_yarn_untempered", 96, L0) == (
        "windowed_yarn", {"target_length": 96, "attention_factor": 1.0})


def test_a_context_of_l0_is_refused_for_the_loss_and_taken_for_retrieval_only(script, capsys):
    with pytest.raises(SystemExit):
        script.run(["--contexts", "8192", "--methods", "plain"])
    assert "or equal to it with --skip-loss" in capsys.readouterr().err


def test_logits_come_in_slices_of_logit_rows_and_equal_one_head_call(script, monkeypatch):
    """Gemma's 262k vocabulary made 4,096 rows of logits 21 GB with the float64 loss: the targets
    of one forward come in slices of LOGIT_ROWS, each the head of the same hidden states (a
    window of 40 targets in slices of 16 here, truncation and full forwards alike)."""
    monkeypatch.setattr(script, "LOGIT_ROWS", 16)
    model = _model()
    ids = torch.randint(3, 128, (1, 100), generator=torch.Generator().manual_seed(5))
    for window, chunk in ((None, 1024), (50, 40)):
        pieces = list(script.target_logits(model, ids, 60, window, chunk))
        assert [(a, b) for a, b, _ in pieces] == [(60, 76), (76, 92), (92, 100)]
        got = torch.cat([logits for _, _, logits in pieces])
        with torch.no_grad():
            context = ids if window is None else ids[:, 100 - 1 - window:99]
            hidden = model.model(input_ids=context).last_hidden_state[0]
            first = 59 if window is None else 60 - (100 - window)
            want = model.lm_head(hidden[first:first + 40]).float()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
