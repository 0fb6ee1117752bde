"""The one table writer of the bench suite: a :class:`BenchTable` prints itself (rich) and
writes itself as JSON (rows, notes, meta), CSV and Markdown."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: A column: (row key, header, format spec).
Column = tuple[str, str, str]

#: Headers printed left-aligned (names); every other column is a number, right-aligned.
_TEXT_HEADERS = ("method", "encoding", "backend", "dtype")


@dataclass
class BenchTable:
    """One benchmark's result: ``rows`` (dicts; ``error`` / ``bwd_error`` where a configuration
    could not run) shown as ``columns``, with ``notes`` on how it was measured.

    ``name`` is the file stem :meth:`write` uses (e.g. ``attention-cuda``).
    """

    title: str
    name: str
    rows: list[dict]
    columns: Sequence[Column]
    notes: list[str] = field(default_factory=list)

    def _cells(self, row: dict) -> list[str]:
        return ["" if row.get(key) is None else format(row[key], fmt) for key, _, fmt in self.columns]

    def print(self) -> None:
        """Print as a rich table, then the notes; a row's error stands in its empty last column."""
        from rich.console import Console
        from rich.table import Table

        table = Table(title=self.title)
        for _, header, _ in self.columns:
            table.add_column(header, justify="left" if header in _TEXT_HEADERS else "right")
        last = self.columns[-1][0]
        for row in self.rows:
            cells = self._cells(row)
            if row.get(last) is None:
                cells[-1] = row.get("error", "")
            table.add_row(*cells)
        console = Console()
        console.print(table)
        for note in self.notes:
            console.print(f"note: {note}", markup=False)  # notes name extras like posenc[bench]

    def write(self, out: str | Path, meta: dict | None = None) -> list[Path]:
        """Write ``out/<name>.json`` (rows, notes and ``meta``: device, torch version, ...),
        ``out/<name>.csv`` and ``out/<name>.md`` (a Markdown table, each row's errors in a
        last column, the notes under it). Returns the paths."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"{self.name}.json", out / f"{self.name}.csv", out / f"{self.name}.md"]
        paths[0].write_text(json.dumps({"meta": meta or {}, "notes": list(self.notes), "rows": self.rows}, indent=1) + "\n")
        named = [key for key, _, _ in self.columns]
        keys = named + sorted({k for row in self.rows for k in row} - set(named))
        with paths[1].open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=keys)
            writer.writeheader()
            writer.writerows(self.rows)
        lines = ["| " + " | ".join(header for _, header, _ in self.columns) + " | notes |",
                 "|" + "---|" * (len(self.columns) + 1)]
        for row in self.rows:
            problems = "; ".join(row[k] for k in ("error", "bwd_error") if k in row)
            lines.append("| " + " | ".join(self._cells(row)) + f" | {problems} |")
        paths[2].write_text("\n".join(lines + [""] + [f"- {note}" for note in self.notes]) + "\n")
        return paths


# The writer under the names the benchmarks/ scripts call.

def print_table(title: str, rows: list[dict], columns: Sequence[Column], notes: Sequence[str] = ()) -> None:
    """Print rows as a rich table (:meth:`BenchTable.print`)."""
    BenchTable(title, "", rows, columns, list(notes)).print()


def write_tables(out, name: str, rows: list[dict], columns: Sequence[Column], notes: Sequence[str] = (),
                 meta: dict | None = None) -> list[Path]:
    """``out/name.json``, ``.csv`` and ``.md`` (:meth:`BenchTable.write`). Returns the paths."""
    return BenchTable("", name, rows, columns, list(notes)).write(out, meta)


def write_table(path, title: str, rows: list[dict], columns: Sequence[Column], notes: Sequence[str] = ()) -> list[Path]:
    """The table as ``path`` (Markdown) with its JSON and CSV beside it (same stem), the title
    in the JSON's meta (:meth:`BenchTable.write`)."""
    path = Path(path)
    return BenchTable(title, path.stem, rows, columns, list(notes)).write(path.parent, {"title": title})
