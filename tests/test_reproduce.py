"""The published shape, at the default benchmark size (minutes: marked slow, run with -m slow).

Press et al. (2022, Table 2) and the prototype at this scale: ALiBi holds its loss past the
training length; sinusoidal and learned absolute positions break; RoPE lies between.
"""

import pytest

from posenc.lab.data import load_corpus
from posenc.lab.experiments.extrapolation import preset_config, run_extrapolation


@pytest.mark.slow
def test_default_run_reproduces_the_extrapolation_ranking(tmp_path):
    config = preset_config("default", encodings=("sinusoidal", "learned", "rope", "alibi"), eval_factors=(1, 8))
    results = run_extrapolation(config, load_corpus(), tmp_path)["results"]
    at = {name: (res["eval"]["64"]["loss"], res["eval"]["512"]["loss"]) for name, res in results.items()}
    assert abs(at["alibi"][1] / at["alibi"][0] - 1) < 0.02
    for name in ("sinusoidal", "learned"):
        assert at[name][1] > 1.3 * at[name][0], name
    assert at["alibi"][1] < at["rope"][1] < min(at["sinusoidal"][1], at["learned"][1])
