"""One place for what the CLI prints: rich tables for people, JSON for pipes.

Tables and progress go through these helpers so every subcommand looks the
same; with ``--json`` a command writes exactly one JSON document to stdout and
nothing else (progress and notes go to stderr).
"""

from __future__ import annotations

import json
import math
import sys
import threading
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

# Redirected output is read in files and logs, not an 80-column terminal: give tables room.
stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
stderr = Console(stderr=True, soft_wrap=True)


def _plain(value: Any) -> Any:
    """Make numpy/torch scalars and arrays JSON-serialisable."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return _plain(asdict(value))
    return value


def emit_json(document: Any) -> None:
    """Write one JSON document to stdout."""
    sys.stdout.write(json.dumps(_plain(document), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def fmt(value: Any, digits: int = 3) -> str:
    """Human formatting for table cells: thousands separators, short floats."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.{digits}g}"
        return f"{value:,.{digits}f}".rstrip("0").rstrip(".") if "." in f"{value:.{digits}f}" else f"{value:,}"
    return str(value)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None) -> Table:
    """A rich table with the first column left-aligned and the rest right-aligned."""
    out = Table(title=title, caption=caption, title_justify="left")
    for i, name in enumerate(columns):
        out.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        out.add_row(*(fmt(cell) for cell in row))
    return out


def key_value_table(title: str, pairs: Iterable[tuple[str, Any]]) -> Table:
    """A two-column table of labelled values, no header."""
    out = Table(title=title, show_header=False, title_justify="left")
    out.add_column(style="bold")
    out.add_column()
    for key, value in pairs:
        out.add_row(key, fmt(value))
    return out


def note(message: str) -> None:
    """A remark for people, on stderr so stdout stays clean for pipes."""
    stderr.print(message, highlight=False)


# Work that finishes sooner never shows a progress display.
PROGRESS_DELAY_S = 2.0


class DelayedProgress:
    """A progress bar on stderr that appears only once the work has run for
    `delay` seconds, and only on a terminal (redirected, rich would leave
    stray lines). Stage by stage: call the object with the name of the stage
    starting, one of `stages` (a single stage shows a spinner and the time);
    or count steps with :meth:`update`.
    """

    def __init__(self, stages: Sequence[str], enabled: bool = True, delay: float = PROGRESS_DELAY_S):
        self.stages = list(stages)
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description:<12}"),
            BarColumn(),
            TimeElapsedColumn(),
            console=stderr,
            transient=True,
        )
        self.task = self.progress.add_task(self.stages[0], total=len(self.stages))
        self.shown = False
        self.timer = threading.Timer(delay, self._show) if enabled and stderr.is_terminal else None

    def _show(self) -> None:
        self.shown = True
        self.progress.start()

    def __enter__(self) -> "DelayedProgress":
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer.join()
        if self.shown:  # stopping a bar never shown would still print a blank line
            self.progress.stop()

    def __call__(self, stage: str) -> None:
        self.update(stage, self.stages.index(stage), len(self.stages))

    def update(self, description: str, completed: int, total: int) -> None:
        self.progress.update(self.task, description=description, completed=completed, total=total)
