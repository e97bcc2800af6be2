"""Progress output: :class:`Reporter` (rank 0's stderr lines and progress bars)."""

from __future__ import annotations

from typing import Any
from lipcli._util.safetext import clean


class Reporter:
    """Rank 0's stderr output: resolved config, progress bars (TTY only), one line per epoch."""

    def __init__(self, enabled: bool, console: Any = None) -> None:
        self.enabled = enabled
        self.console = console
        self.progress = None
        self.task = None
        if enabled and console is None:
            from rich.console import Console

            self.console = Console(stderr=True)

    def print(self, text: str) -> None:
        if self.enabled:  # no control characters (paths and names may come from a checkpoint)

            self.console.print(clean(text), highlight=False, markup=False, soft_wrap=True)

    def start(self) -> None:
        if not self.enabled or not self.console.is_terminal:
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)

        self.progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}  acc {task.fields[acc]:.3f}  "
                       "{task.fields[ips]:.0f} img/s"),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=self.console, transient=True,
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=1, epoch="", loss=0.0, acc=0.0, ips=0.0)

    def epoch(self, epoch: int, epochs: int, total: int) -> None:
        if self.progress is not None:
            self.progress.reset(self.task, total=total, epoch=f"{epoch}/{epochs}", loss=0.0, acc=0.0, ips=0.0)

    def update(self, completed: int, loss: float, acc: float, ips: float) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=completed, loss=loss, acc=acc, ips=ips)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
