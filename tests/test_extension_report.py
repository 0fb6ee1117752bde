"""posenc.lab.experiments.extension_report on a hand-made summary: the numbers in each table are
the ones worked out here."""

import math

from posenc.lab.experiments.extension_report import (bits_table, change_table, extension_rows, has_extension_rows,
                                                     passkey_table, summary_markdown)


def _cell(bits: float, std_bits: float = 0.0, seeds: int = 2) -> dict:
    return {"loss": bits * math.log(2), "bits_per_byte": bits, "loss_std": std_bits * math.log(2), "seeds": seeds}


SUMMARY = {
    "config": {"eval_lengths": [50, 100, 400], "train": {"seq_len": 100}, "seeds": [0, 1], "eval_tokens": 800},
    "results": {
        "rope": {"eval": {"50": _cell(2.0, 0.1), "100": _cell(1.9, 0.1), "400": _cell(4.0, 0.2)},
                 "passkey": {"100": {"0.0": 1.0, "1.0": 0.5}, "400": {"0.0": 0.0, "1.0": 0.0}}},
        "alibi": {"eval": {"50": _cell(1.0), "100": _cell(1.0), "400": _cell(1.0)}},
        "rope+yarn": {"extension": {"method": "yarn", "factor": 4},
                      "eval": {"50": _cell(2.25, 0.05), "100": _cell(2.0, 0.05), "400": _cell(2.5, 0.05)},
                      "passkey": {"100": {"0.0": 1.0, "1.0": 1.0}, "400": {"0.0": 0.25, "1.0": 0.75}}},
        "rope+self_extend": {"extension": {"method": "self_extend", "factor": 4},
                             "eval": {"50": _cell(2.0), "100": _cell(1.9), "400": _cell(2.125)}},
    },
}


def test_rows_are_rope_and_the_extension_rows_only():
    assert extension_rows(SUMMARY) == ["rope", "rope+yarn", "rope+self_extend"]
    assert has_extension_rows(SUMMARY)
    assert not has_extension_rows({"results": {"rope": {}}})


def test_bits_table_gives_mean_and_spread_in_bits():
    table = bits_table(SUMMARY).splitlines()
    assert table[0] == "| row | 0.5L (50) | L (100) | 4L (400) |"
    assert table[2] == "| rope | 2.000 ± 0.100 | 1.900 ± 0.100 | 4.000 ± 0.200 |"
    assert table[3] == "| rope+yarn | 2.250 ± 0.050 | 2.000 ± 0.050 | 2.500 ± 0.050 |"


def test_change_table_is_row_minus_rope():
    table = change_table(SUMMARY).splitlines()
    assert table[2] == "| rope+yarn | +0.250 | +0.100 | -1.500 |"
    assert table[3] == "| rope+self_extend | +0.000 | +0.000 | -1.875 |"


def test_passkey_table_averages_over_depths():
    table = passkey_table(SUMMARY).splitlines()
    assert table[0] == "| row | L | 4L |"
    assert table[2] == "| rope | 0.75 | 0.00 |"
    assert table[3] == "| rope+yarn | 1.00 | 0.50 |"


def test_summary_names_the_best_row_past_L():
    assert "- 4L (400): rope+self_extend, 2.125" in summary_markdown(SUMMARY)
