"""Every ``lip`` command in the README, docs/ and every plugin README runs as typed, at a tiny size.

The commands are read from the Markdown itself (fenced ``bash``/``console`` blocks and indented
code lines), so a renamed option, a removed component or a parameter out of range in any
example fails here.  "At a tiny size": the command keeps every option it was typed with; the
test adds options that shrink it (one epoch, width 4, a few images or steps) only where the
command does not set them itself and the command has them, runs commands of one document in
order in one folder (so ``lip certify m.safetensors`` finds the ``m.safetensors`` a ``lip train``
above it wrote), and points CIFAR at a tiny CIFAR-10 in the real on-disk layout.  Written
notation is resolved as a reader would: ``a|b`` takes ``a``, ``[...]`` is left out, ``...``
("the rest as above") is dropped, ``MODEL`` is the model trained last in that document.
Running them all takes minutes, so it is a slow test (``bash .ci/run -m slow``); the fast suite
checks every command's options parse and every component it names resolves.  Commands for CUDA
(``--device cuda``) are parsed here and run by ``tools/device_check.sh`` on a GPU.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: options added where the command has them and does not set them itself (name -> value)
TINY = {
    "train": {"--epochs": "1", "--width": "4", "--limit-train": "48", "--limit-test": "16",
              "--batch-size": "16", "--overwrite": None},
    "certify": {"--limit": "16", "--attack-steps": "2", "--attack-restarts": "1", "--batch-size": "16"},
    "bench train": {"--steps": "1", "--warmup": "0", "--batch-size": "4", "--width": "4", "--no-memory": None},
    "bench profile": {"--steps": "1", "--warmup": "0", "--batch-size": "4", "--width": "4"},
    "bench certify": {"--n": "8", "--batch-size": "8", "--width": "4", "--fit-head": "2", "--path-rounds": "1"},
    "export": {"--overwrite": None},
    "import": {"--limit": "16", "--overwrite": None},
}
#: options whose typed value is replaced by the tiny one (sizes only; never a component or a setting)
SHRINK = {"train": {"--epochs", "--width", "--batch-size"},
          "certify": {"--attack-steps", "--attack-restarts", "--limit"},
          "bench train": {"--steps", "--warmup", "--batch-size", "--width"},
          "bench profile": {"--steps", "--warmup", "--batch-size", "--width"},
          "bench certify": {"--n", "--batch-size", "--width", "--fit-head", "--path-rounds"}}


@dataclass(frozen=True)
class DocCommand:
    doc: str  # path relative to the repository root
    line: int
    text: str  # as typed (after the prompt / venv prefix)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "plugins").glob("*/README.md"))]


def _code_lines(markdown: str):
    """(line number, text) of every command inside a shell code block (fenced bash/sh/console or
    indented), a command continued with a trailing backslash joined into one."""
    pending: tuple[int, str] | None = None
    for number, text in _raw_code_lines(markdown):
        if pending is not None:
            number, text = pending[0], pending[1] + " " + text
            pending = None
        if text.endswith("\\"):
            pending = (number, text[:-1].rstrip())
            continue
        yield number, text


def _raw_code_lines(markdown: str):
    fence = None
    for number, line in enumerate(markdown.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else (stripped[3:].strip() or "text")
            continue
        if fence is not None:
            if fence in ("bash", "sh", "console", "shell"):
                yield number, stripped
        elif line.startswith("    ") and stripped:
            yield number, stripped


def doc_commands() -> list[DocCommand]:
    found = []
    for path in _documents():
        for number, text in _code_lines(path.read_text()):
            text = re.sub(r"\s+#.*$", "", text.removeprefix("$ "))
            for part in text.split("&&"):
                part = part.strip().removeprefix(".venv/bin/")
                if part.startswith("lip ") or part == "lip":
                    found.append(DocCommand(str(path.relative_to(ROOT)), number, part))
    return found


COMMANDS = doc_commands()


def test_commands_are_found_in_every_kind_of_document():
    docs = {c.doc for c in COMMANDS}
    assert "README.md" in docs and "docs/benchmarks.md" in docs
    assert any(d.startswith("plugins/") for d in docs)
    assert len(COMMANDS) >= 40, [c.id for c in COMMANDS]


def _subcommand(tokens: list[str]) -> str:
    return " ".join(tokens[:2]) if tokens[0] == "bench" else tokens[0]


def _options_of(sub: str) -> set[str]:
    import typer

    from lipcli.cli import app

    group = typer.main.get_command(app)
    cmd = group
    for name in sub.split():
        cmd = cmd.commands[name]  # type: ignore[union-attr]
    return {opt for p in cmd.params if p.param_type_name == "option" for opt in (*p.opts, *p.secondary_opts)}


def tiny_args(command: DocCommand, last_model: str | None) -> list[str]:
    """The command's arguments as typed, notation resolved, shrunk to a tiny size."""
    text = re.sub(r"\s*\[[^\]]*\]", "", command.text)  # [optional parts]
    tokens = [t.split("|")[0] if "|" in t and not t.startswith("|") else t for t in shlex.split(text)[1:]]
    tokens = [t for t in tokens if t != "..."]
    tokens = [last_model if t == "MODEL" and last_model else t for t in tokens]
    if not tokens:
        return tokens
    sub = _subcommand(tokens)
    if sub not in TINY:
        return tokens
    have = _options_of(sub)
    shrink = SHRINK.get(sub, set())
    out: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in shrink and i + 1 < len(tokens):
            i += 2  # the tiny value replaces it below
            continue
        out.append(tok)
        i += 1
    if "--arch" in out and "width=" in out[out.index("--arch") + 1]:  # the architecture sets the width
        spec = out.index("--arch") + 1
        out[spec] = re.sub(r"width=\d+", "width=" + TINY[sub]["--width"], out[spec])
        have = have - {"--width"}
    for opt, value in TINY[sub].items():
        if opt in have and opt not in out:
            out += [opt] if value is None else [opt, value]
    return out


def _writes_model(args: list[str]) -> str | None:
    if not args or args[0] not in ("train", "import"):
        return None
    for flag in ("-o", "--out"):
        if flag in args:
            return args[args.index(flag) + 1]
    return None


def _needs_cuda(command: DocCommand) -> bool:
    return "--device cuda" in command.text


def _by_document() -> dict[str, list[DocCommand]]:
    groups: dict[str, list[DocCommand]] = {}
    for c in COMMANDS:
        groups.setdefault(c.doc, []).append(c)
    return groups


def _run_document(doc: str) -> int:
    """Run the document's commands in order in the current folder; returns how many ran."""
    from lipcli.testing import run_lip

    last_model = last_checkpoint = None
    ran = 0
    for command in _by_document()[doc]:
        if _needs_cuda(command):
            continue
        args = tiny_args(command, last_model)
        if args[0] == "import" and len(args) > 1:  # a repository file, or "your checkpoint": the last one named
            if (ROOT / args[1]).is_file():
                args[1] = last_checkpoint = str(ROOT / args[1])
            elif not Path(args[1]).exists() and last_checkpoint:
                args[1] = last_checkpoint
        for flag in ("-o", "--out"):
            if flag in args:
                Path(args[args.index(flag) + 1]).parent.mkdir(parents=True, exist_ok=True)
        result = run_lip(args)  # a non-finite loss stops lip train with exit 1 (train/guard.py)
        assert result.exit_code == 0, f"{command.id}: lip {' '.join(args)}\n{result.output[-3000:]}"
        last_model = _writes_model(args) or last_model
        ran += 1
    return ran


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted(_by_document()))
def test_every_command_of_a_document_runs_as_typed(doc, tmp_path, monkeypatch, cifar10_root):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIPCLI_DATA", str(cifar10_root))
    if doc != "README.md":  # the other documents start from the README's quick-start model
        _run_document("README.md")
    ran = _run_document(doc)
    assert ran or all(_needs_cuda(c) for c in _by_document()[doc])


#: option -> component kind, for the commands that take one component per option
_COMPONENT_OPTIONS = {"--conv": "conv", "--activation": "activation", "--pool": "pool", "--head": "head",
                      "--loss": "loss", "--arch": "arch", "--dataset": "dataset"}


@functools.cache
def _click_app():
    import typer

    from lipcli.cli import app

    return typer.main.get_command(app)


def check_parses(command: DocCommand) -> None:
    """Raise unless the command's options parse (names, types) and, for ``lip train``, every
    component it names exists and accepts the parameters given (ranges included)."""
    from lipcli.host.plugins import get_registry

    args = tiny_args(command, "m.safetensors")
    cmd = _click_app()
    for name in _subcommand(args).split():
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    rest = args[len(_subcommand(args).split()):]
    cmd.make_context(_subcommand(args), list(rest))  # raises on an unknown option or a bad value
    if args[0] != "train":
        return
    registry = get_registry()
    for option, kind in _COMPONENT_OPTIONS.items():
        if option in args:
            registry.component(kind, args[args.index(option) + 1])


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_every_command_parses_and_names_valid_components(command):
    check_parses(command)


@pytest.mark.parametrize("text", ["lip train --conv nope", "lip train --conv bro:rank_ratio=7",
                                  "lip train --lr fast", "lip certify MODEL --radius 3",
                                  "lip train --pool polygon:vertices=x"])
def test_a_broken_example_fails_the_check(text):
    with pytest.raises(Exception):
        check_parses(DocCommand("x.md", 1, text))


def test_tiny_args_keep_components_and_resolve_notation():
    c = DocCommand("x.md", 1, "lip bench certify --arch 20 --head lln|mlp --classes 10|100 --n 4096 [--fit-head 300]")
    args = tiny_args(c, None)
    assert args[:6] == ["bench", "certify", "--arch", "20", "--head", "lln"]
    assert "4096" not in args and args[args.index("--n") + 1] == "8"
    assert "--classes" in args and args[args.index("--classes") + 1] == "10"
    c = DocCommand("x.md", 1, "lip certify MODEL --radii 36,72,108 --attack")
    assert tiny_args(c, "m.safetensors")[:4] == ["certify", "m.safetensors", "--radii", "36,72,108"]
    c = DocCommand("x.md", 1, "lip train --conv bro:rank_ratio=0.25 --arch lipconvnet-20 ...")
    args = tiny_args(c, None)
    assert args[:5] == ["train", "--conv", "bro:rank_ratio=0.25", "--arch", "lipconvnet-20"] and "..." not in args


def test_a_continued_command_is_one_command():
    markdown = "```bash\nlip train --conv bro \\\n    --epochs 2   # two\nlip certify\n```\n    lip plugins\n"
    assert list(_code_lines(markdown)) == [(2, "lip train --conv bro --epochs 2   # two"), (4, "lip certify"),
                                           (6, "lip plugins")]
