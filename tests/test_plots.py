"""posenc.lab.plots: a PNG for every registered encoding, small sizes to stay fast."""

from __future__ import annotations

import subprocess
import sys

import pytest

import posenc
from posenc.lab.plots import plot_encoding

SMALL = {"d_model": 16, "num_heads": 4, "head_dim": 8, "max_positions": 32, "max_distance": 48}


@pytest.mark.parametrize("name", posenc.available())
def test_every_registered_encoding_draws_a_png(name, tmp_path):
    out = plot_encoding(name, tmp_path / "sub" / f"{name}.png", **SMALL)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def test_encoding_options_pass_through_and_unknown_names_fail(tmp_path):
    assert plot_encoding("kerple", tmp_path / "k.png", variant="power", **SMALL).stat().st_size > 2000
    with pytest.raises(ValueError, match="unknown encoding 'nope2'"):
        plot_encoding("nope2", tmp_path / "x.png")
    with pytest.raises(ValueError, match="variant"):
        plot_encoding("kerple", tmp_path / "k.png", variant="cubic")


def test_import_posenc_does_not_import_matplotlib():
    code = "import sys, posenc, posenc.lab.plots; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_plot_writes_the_png_and_rejects_unknown_names(tmp_path, capsys):
    from posenc.lab.cli import main

    out = tmp_path / "alibi.png"
    assert main(["plot", "alibi", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert main(["plot", "bogus", "--out", str(tmp_path / "b.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc: error: unknown encoding 'bogus'") and "\n" not in err
