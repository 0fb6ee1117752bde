"""Row providers: extra rows of the extrapolation table built on a finished base run.

The extrapolation sweep trains one model per (encoding, seed). A row provider turns one of
those trained models into more rows (e.g. the rope model extended with RoPE scalings, at
inference and fine-tuned: :mod:`posenc.lab.experiments.rope_extension`). The sweep asks every
provider for its row names, then, on rank 0 once every base run is finished, calls it once per
seed with that seed's :class:`BaseRun`; each provider stores its rows' records in the same
:class:`~posenc.lab.experiments.runs.RunStore`, so they resume as the base runs do.

A provider's records have the base runs' shape (``encoding`` = the row name, ``seed``,
``train_len``, ``parameters``, ``eval``, ``not_applicable``, ...) so that the sweep merges
them into results.json the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from posenc.lab.data import Corpus
from posenc.lab.model import TransformerLM
from posenc.lab.experiments.extrapolation_config import ExtrapolationConfig
from posenc.lab.experiments.runs import Reporter, RunStore


@dataclass(frozen=True)
class BaseRun:
    """A finished (encoding, seed) run of the sweep, as a provider sees it.

    Attributes:
        encoding: the trained encoding (the provider's ``base``).
        seed: the run's seed.
        fingerprint: what the run's result depends on; a provider's row extends it.
        record: the run's stored record.
        model: loads the trained model (eval mode, on the config's device); cached, so a
            provider whose rows are all stored never loads it.
    """

    encoding: str
    seed: int
    fingerprint: dict
    record: dict
    model: Callable[[], TransformerLM]


class RowProvider(Protocol):
    """What the extrapolation sweep needs of a source of extra rows."""

    #: shown by the CLI: "<name> rows: ..."
    name: str
    #: the encoding whose trained runs the rows build on (must be in the config's encodings)
    base: str
    #: the options that ask for these rows, for error messages (e.g. "--rope-scaling")
    options: str

    def rows(self, config: ExtrapolationConfig) -> list[str]:
        """The row names ``config`` asks for, in table order (empty: the provider is off)."""
        ...

    def run(self, config: ExtrapolationConfig, corpus: Corpus, store: RunStore, reporter: Reporter,
            base: BaseRun) -> list[dict]:
        """The records of every row for ``base.seed``, resumed from ``store`` or computed and stored."""
        ...
