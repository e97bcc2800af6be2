"""The parts of a recipe (:class:`~lipcli.sdk.specs.RecipeSpec`, also importable from
:mod:`lipcli.sdk.specs`): where each value was read (:class:`RecipeSource`) and what the paper
reports (:class:`RecipeResult`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RecipeSource:
    """Where one value of a recipe was read: the file of the authors' code (``repo`` as
    ``owner/name``, the full ``commit``, ``path``) and the ``key`` (a settings key, an
    option, or ``"line N"``) in it; ``note``: how the value maps onto lipcli's setting."""

    repo: str
    commit: str
    path: str
    key: str
    note: str = ""

    def text(self) -> str:
        return f"{self.repo}@{self.commit[:7]}:{self.path} ({self.key})" + (f"; {self.note}" if self.note else "")


@dataclass(frozen=True, kw_only=True)
class RecipeResult:
    """An accuracy the paper reports for the recipe: ``clean`` and ``certified`` (radius in
    words, e.g. ``"36/255"``, -> accuracy) in percent on ``dataset``; ``source``: where (and
    what the row is, where it is not exactly the recipe).  ``clean`` is ``None`` and
    ``certified`` partial where the source gives only some of the figures."""

    dataset: str
    certified: dict[str, float]
    source: str
    clean: float | None = None
