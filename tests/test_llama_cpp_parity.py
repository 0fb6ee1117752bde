"""benchmarks/llama_cpp_parity.py reads llama.cpp's logits file as llama.cpp writes it (issue 35, item 5).

No llama.cpp here: the file is written by a port of ``perplexity.cpp``'s writer (``log_softmax``
with a ``uint16_t *`` output: per scored token, float32 scale = (max - min) / 65535 and the
smallest log-prob kept, min = max(min logit, max logit - 16) - max - log-sum-exp, then
q_i = nearest_int((logit_i - min logit) / scale), 0 under the minimum), after the header
"_logits_", n_ctx, n_vocab, n_chunk and the tokens. The benchmark's reader and its token-by-token
comparison must give: llama.cpp's negative log-likelihoods to scale / 2, a KL divergence of zero
and the same top word for a model that computes llama.cpp's logits, a positive one for a model
that does not, and the tokens under llama.cpp's 16-nat floor counted and left out of the pairs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import load_benchmark


@pytest.fixture(scope="module")
def parity():
    return load_benchmark("llama_cpp_parity")


def write_logits_file(path: Path, n_ctx: int, tokens: list[int], logits: np.ndarray) -> None:
    """perplexity.cpp's file for one chunk: ``logits`` (n_ctx - 1 - n_ctx / 2, n_vocab) float32
    are the logits at the scored positions."""
    n_vocab = logits.shape[1]
    nv = 2 * ((n_vocab + 1) // 2) + 4
    with path.open("wb") as out:
        out.write(b"_logits_")
        np.array([n_ctx, n_vocab, 1], dtype=np.int32).tofile(out)
        np.array(tokens, dtype=np.int32).tofile(out)
        for row in logits.astype(np.float32):
            max_logit, min_logit = np.float32(row.max()), np.float32(row.min())
            min_logit = max(min_logit, np.float32(max_logit - 16))
            log_sum_exp = np.float32(np.log(np.exp((row - max_logit).astype(np.float64)).sum()))
            min_log_prob = np.float32(min_logit - max_logit - log_sum_exp)
            scale = np.float32((max_logit - min_logit) / np.float32(65535))
            record = np.zeros(nv, dtype=np.uint16)
            record[:4] = np.array([scale, min_log_prob], dtype=np.float32).view(np.uint16)
            if scale:  # else every q stays 0, as the writer's memset
                record[4:4 + n_vocab] = np.where(row > min_logit, np.rint((row - min_logit) / scale), 0).astype(np.uint16)
            record.tofile(out)


class FixedLogits(torch.nn.Module):
    """A "model" whose logits at the scored positions are given."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.scored = logits

    def forward(self, input_ids, logits_to_keep, use_cache):
        extra = torch.zeros(1, logits_to_keep - self.scored.shape[0], self.scored.shape[1])
        return type("Out", (), {"logits": torch.cat([self.scored[None], extra], 1)})()


def test_the_reader_and_the_comparison(parity, tmp_path):
    n_ctx, n_vocab = 64, 300
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(n_ctx - 1 - n_ctx // 2, n_vocab, generator=gen) * 2  # within 16 nats
    tokens = torch.randint(0, n_vocab, (n_ctx,), generator=gen).tolist()
    # one target far under the top word: llama.cpp's file clamps it
    logits[3, tokens[n_ctx // 2 + 4]] = logits[3].max() - 40
    path = tmp_path / "logits.bin"
    write_logits_file(path, n_ctx, tokens, logits.numpy())
    row = parity.Row("smollm2", n_ctx, 1)
    read_tokens, records, vocab = parity.llama_cpp_log_probs(path, row)
    assert read_tokens.tolist() == tokens and vocab == n_vocab

    same = parity.compare_to_llama_cpp(FixedLogits(logits), tokens, row, None, records, n_vocab)
    assert same["tokens_clamped_by_llama_cpp"] == 1 and same["tokens_scored"] == logits.shape[0]
    assert abs(same["nll_minus_llama_cpp"]) < 2e-4  # scale / 2 <= 16 / 65535 / 2
    assert same["mean_kld"] < 1e-6 and same["same_top"] == 1.0
    exact = torch.nn.functional.cross_entropy(logits.double(), torch.tensor(tokens[n_ctx // 2 + 1:])).exp().item()
    assert same["ppl"] == pytest.approx(exact, rel=1e-9)

    moved = logits + torch.randn(logits.shape, generator=gen) * 0.5
    other = parity.compare_to_llama_cpp(FixedLogits(moved), tokens, row, None, records, n_vocab)
    reference = (torch.log_softmax(logits.double(), -1).exp() * (torch.log_softmax(logits.double(), -1)
                                                                 - torch.log_softmax(moved.double(), -1))).sum(-1)
    assert other["mean_kld"] == pytest.approx(reference.mean().item(), rel=0.02)
    assert other["mean_kld"] > 0.05


def test_a_wrong_header_is_refused(parity, tmp_path):
    path = tmp_path / "logits.bin"
    write_logits_file(path, 8, list(range(8)), np.zeros((3, 4), dtype=np.float32))
    with pytest.raises(RuntimeError, match="expected 16 x 1"):
        parity.llama_cpp_log_probs(path, parity.Row("smollm2", 16, 1))
    path.write_bytes(b"not a logits file" + bytes(20))
    with pytest.raises(RuntimeError, match="not a llama-perplexity logits file"):
        parity.llama_cpp_log_probs(path, parity.Row("smollm2", 8, 1))
