"""The package version, defined once (read by ``pyproject.toml``'s dynamic version, the model
file's metadata and ``lip --version``); a module of its own so that no module below
:mod:`lipcli` imports the package root."""

__version__ = "0.2.0"
