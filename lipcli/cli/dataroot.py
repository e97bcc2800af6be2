"""The default data root of ``lip train`` and ``lip certify``: a CIFAR data set named without
``--data-dir`` lives in :func:`lipcli.data.loaders.default_data_root` (``$LIPCLI_DATA``, else the
user cache folder + ``lipcli/data``), is downloaded there when missing (unless
``--no-download``), and the folder used is printed on stderr once the data set is read from
it (:func:`default_root`: a command that fails before, e.g. offline, says one line, its error,
which names the folder and where it comes from: ``LIPCLI_DATA`` or the default data root).
With ``--data-dir`` nothing is downloaded unless ``--download`` is given."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import typer

from lipcli.data.roots import for_certification, for_training  # noqa: F401  (re-exported)


def source() -> str:
    """Where the default data root comes from: ``LIPCLI_DATA`` when set, else "the default
    data root" (the user cache folder), with how to choose another."""
    from lipcli.data.loaders import DATA_ENV

    if os.environ.get(DATA_ENV, "").strip():
        return DATA_ENV
    return f"the default data root (set {DATA_ENV} or pass --data-dir to use another)"


@contextlib.contextmanager
def default_root(root: str | None, quiet: bool) -> Iterator[None]:
    """The block runs a command whose data set lives in the default data root ``root`` (None:
    a folder the user named; nothing is done): ``data: ROOT ...`` is printed once the data
    set has been read from it (:func:`announce`), and an error about the folder names where
    it comes from (:func:`source`) instead of ``--data-dir``, which was not given."""
    if root is None:
        yield
        return
    from lipcli.builtins.datasets.cifar import DownloadError
    from lipcli.data.loaders import on_data_loaded
    from lipcli.sdk.errors import LipUsageError, SettingError

    said: list[str] = []

    def loaded(where: str | None) -> None:
        same = where is not None and os.path.abspath(os.path.expanduser(where)) == os.path.abspath(root)
        if same and not said:
            said.append(root)
            announce(Path(root), quiet)

    try:
        with on_data_loaded(loaded):
            yield
    except SettingError as exc:  # the folder's (data_dir), or no data set in it (download)
        if exc.setting not in ("data_dir", "download"):
            raise
        raise LipUsageError(f"{source()}: {exc}") from None
    except DownloadError as exc:
        exc.root_note = source().split(" (", 1)[0] + "; "
        raise


def announce(root: Path, quiet: bool) -> None:
    """``data: ROOT ...`` on stderr (not with ``--quiet``, nor in a worker process of a
    multi-process run: the launching process or rank 0 says it)."""
    from lipcli.cli.common import other_rank
    from lipcli.data.loaders import DATA_ENV
    from lipcli.train.config import LAUNCH_ERRORS_ENV

    if quiet or other_rank() or os.environ.get(LAUNCH_ERRORS_ENV):
        return
    typer.echo(f"data: {root} (the default data root; set {DATA_ENV} or pass --data-dir to use "
               "another)", err=True)
