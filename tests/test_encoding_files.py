"""One file per encoding, named after it (docs/design.md), and docs/encodings.md's file column
says where each one is."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import posenc
from posenc.encodings import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
ENCODINGS = Path(posenc.__file__).resolve().parent / "encodings"

#: The RoPE wing groups its variants by what they share: RoPE and p-RoPE one rotation with other
#: frequencies (rope/rotary.py), M-RoPE and axial RoPE one multi-axis angle table (rope/multiaxis.py).
WING = {"rope": "rope/rotary.py", "p_rope": "rope/rotary.py", "xpos": "rope/xpos.py",
        "mrope": "rope/multiaxis.py", "axial_rope": "rope/multiaxis.py", "fope": "rope/fope.py",
        "liere": "rope/liere.py", "comrope": "rope/comrope.py", "vo_rope": "rope/vo_rope.py",
        "videorope": "rope/videorope.py", "mhrope": "rope/mhrope.py",
        "grape": "rope/grape.py"}


def _file_of(name: str) -> str:
    return Path(inspect.getsourcefile(REGISTRY[name])).resolve().relative_to(ENCODINGS).as_posix()


def test_every_encoding_lives_in_a_file_named_after_it():
    for name in posenc.available():
        assert _file_of(name) == WING.get(name, f"{name}.py"), name


def test_docs_file_column_matches_the_source():
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| `encodings/([\w/]+\.py)` \|", (ROOT / "docs/encodings.md").read_text(), re.M)
    documented = dict(rows)
    assert set(documented) == set(posenc.available())
    for name, path in documented.items():
        assert _file_of(name) == path, name
