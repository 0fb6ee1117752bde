"""``posenc audit`` on released config.json files (tests/data/configs, sources in SOURCES.md).

Every file ends in exit 0 (posenc reads it and the audit model agrees layer by layer) or exit 2
with the reason named (a family posenc does not read, a key the family needs); never 1 (a
false alarm) and never an internal error. Short inputs by default (the shrunk models are built
three times each); every file at the default length behind ``slow``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from posenc.errors import InvalidArgument
from posenc.integrations import audit as audit_module
from posenc.lab.cli import main

CONFIGS = Path(__file__).parent / "data" / "configs"

#: file -> the reason of a refusal (a substring of the error), or None: read, exit 0.
EXPECTED = {
    "aya-23-8b": None,
    "chatglm3-6b": "'chatglm'",
    "codellama-7b": None,
    "deepseek-v2-lite": "'deepseek_v2'",
    "falcon-7b-refinedwebmodel": "'n_head'",
    "gemma-2-2b": None,
    "gemma-2-9b": None,
    "gemma-2b": None,
    "gemma-3-1b-it": None,
    "gpt-j-6b": None,
    "gpt2": None,
    "llama-2-7b": None,
    "llama-3.1-8b": None,
    "llama-3.2-1b": None,
    "llava-1.5-7b": "'num_hidden_layers'",
    "ministral-3-3b-2512": "'ministral3'",
    "mistral-7b-v0.1": None,
    "mistral-7b-v0.3": None,
    "mixtral-8x7b-v0.1": None,
    "olmo-2-7b": None,
    "phi-2-msft": "'num_hidden_layers'",
    "phi-3.5-mini": None,
    "phi-3.5-vision": "'phi3_v'",
    "phi-4-mini-instruct": None,
    "qwen1.5-1.8b-chat": None,
    "qwen1.5-moe-a2.7b": "'qwen2_moe'",
    "qwen2.5-3b": None,
    "qwen3-0.6b": None,
    "redpajama-incite-3b-v1": None,
    "stablelm-2-zephyr-1.6b": None,
    "starcoder2": "'starcoder2'",
    "tinyllama-1.1b-chat-v1.0": None,
}
#: one file per family read, run by default (the rest behind ``slow``)
DEFAULT = {"gemma-2-9b", "gemma-3-1b-it", "gpt-j-6b", "gpt2", "llama-3.1-8b", "mistral-7b-v0.1", "phi-3.5-mini",
           "qwen2.5-3b", "redpajama-incite-3b-v1", "stablelm-2-zephyr-1.6b", "aya-23-8b"}


def _cases(length):
    marks = lambda name: () if EXPECTED[name] is not None or name in DEFAULT else (pytest.mark.slow,)
    return [pytest.param(name, length, marks=marks(name) if length is not None else (pytest.mark.slow,),
                         id=f"{name}-{length or 'default'}")
            for name in sorted(EXPECTED)]


def _audit(name, length):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return audit_module.audit(CONFIGS / f"{name}.json", length=length)


def test_every_gathered_file_is_listed():
    assert sorted(path.stem for path in CONFIGS.glob("*.json")) == sorted(EXPECTED)
    sources = (CONFIGS / "SOURCES.md").read_text("utf-8")
    assert all(f"`{name}.json`" in sources for name in EXPECTED)


@pytest.mark.parametrize("name, length", _cases(64) + _cases(None))
def test_a_released_file_exits_0_or_2_with_a_named_reason(name, length):
    reason = EXPECTED[name]
    if reason is None:
        report = _audit(name, length)
        assert report.ok, [(row.plan, row.max_diff, row.tolerance, row.disagreement) for row in report.rows]
    else:
        with pytest.raises(InvalidArgument, match=reason.replace(".", r"\.")):
            _audit(name, length)


def test_the_cli_exit_codes_on_released_files(capsys):
    assert main(["audit", str(CONFIGS / "gpt2.json"), "--length", "16"]) == 0
    assert main(["audit", str(CONFIGS / "starcoder2.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc: error:") and "starcoder2" in err
