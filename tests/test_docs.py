"""The docs cannot drift from the code: every hook and spec field is documented in
docs/plugins.md, its file blocks are the real files, docs/cli.md is today's ``--help``, and
the README stays an entry page whose links exist."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
import torch

from lipcli.sdk import hookspecs
from lipcli.sdk.losses import LossContext, LossOutput
from lipcli.sdk.specs import SPEC_KINDS, Component, ComponentSpec, Param

ROOT = Path(__file__).resolve().parent.parent
PLUGINS_DOC = ROOT / "docs" / "plugins.md"
README = ROOT / "README.md"


def _load_generator():
    spec = importlib.util.spec_from_file_location("lipcli_gen_docs", ROOT / "docs" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_docs = _load_generator()


def _sections(markdown: str) -> dict[str, str]:
    """Heading line -> the text up to the next heading (code blocks are not headings)."""
    sections: dict[str, str] = {}
    heading, lines, fenced = None, [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("#"):
            if heading is not None:
                sections[heading] = "\n".join(lines)
            heading, lines = line, []
        else:
            lines.append(line)
    if heading is not None:
        sections[heading] = "\n".join(lines)
    return sections


def _section(sections: dict[str, str], name: str) -> str:
    found = [text for head, text in sections.items() if f"`{name}`" in head]
    assert found, f"docs/plugins.md has no section headed `{name}`"
    return found[0]


def _hooks() -> list[str]:
    return sorted(name for name in dir(hookspecs)
                  if hasattr(getattr(hookspecs, name), f"{hookspecs.PROJECT_NAME}_spec"))


def test_the_hooks_are_found():
    hooks = _hooks()
    assert "lip_losses" in hooks and "lip_pools" in hooks
    assert set(hooks) == set(hookspecs.HOOK_KINDS)


@pytest.mark.parametrize("hook", _hooks())
def test_every_hook_has_a_section_with_its_contract(hook):
    section = _section(_sections(PLUGINS_DOC.read_text()), f"{hook}()")
    spec_class = SPEC_KINDS[hookspecs.HOOK_KINDS[hook]]
    assert spec_class.__name__ in section, f"{hook}: the section does not name {spec_class.__name__}"
    assert "factory(" in section, f"{hook}: the section does not give the factory's call"


def _own_fields(cls: type) -> list[str]:
    base = {f.name for f in dataclasses.fields(ComponentSpec)}
    return [f.name for f in dataclasses.fields(cls) if f.name not in base]


_DOCUMENTED = [(ComponentSpec, f.name) for f in dataclasses.fields(ComponentSpec)]
_DOCUMENTED += [(cls, name) for cls in SPEC_KINDS.values() for name in _own_fields(cls)]
_DOCUMENTED += [(cls, f.name) for cls in (Param, Component, LossContext, LossOutput)
                for f in dataclasses.fields(cls)]


@pytest.mark.parametrize(("cls", "field"), _DOCUMENTED,
                         ids=[f"{c.__name__}.{f}" for c, f in _DOCUMENTED])
def test_every_spec_field_is_documented(cls, field):
    """Each field has a table row in the section headed with its class (``ComponentSpec``
    for the fields every spec shares)."""
    section = _section(_sections(PLUGINS_DOC.read_text()), cls.__name__)
    assert re.search(rf"^\| `{re.escape(field)}` \|", section, re.MULTILINE), (
        f"docs/plugins.md does not document {cls.__name__}.{field}")


def test_specs_that_add_no_field_are_named():
    section = _section(_sections(PLUGINS_DOC.read_text()), "ComponentSpec")
    for cls in SPEC_KINDS.values():
        if not _own_fields(cls):
            assert f"`{cls.__name__}`" in section, f"{cls.__name__} is not mentioned"


def test_file_blocks_are_the_real_files():
    text = PLUGINS_DOC.read_text()
    blocks = gen_docs.includes(text)
    paths = {path for path, _ in blocks}
    assert "plugins/lipcli-polygon-pool/src/lipcli_polygon_pool/plugin.py" in paths
    assert "plugins/lipcli-polygon-pool/pyproject.toml" in paths
    for path, body in blocks:
        assert body == (ROOT / path).read_text(), (
            f"docs/plugins.md's copy of {path} differs from the file: run python docs/gen_docs.py")
    assert gen_docs.render_includes(text) == text


def test_include_rewrites_a_drifted_block(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    doc = "intro\n<!-- include: a.py -->\n```python\nx = 0  # drifted\n```\nafter\n"
    fixed = gen_docs.render_includes(doc, tmp_path)
    assert fixed == "intro\n<!-- include: a.py -->\n```python\nx = 1\n```\nafter\n"
    assert gen_docs.includes(fixed) == [("a.py", "x = 1\n")]


def test_cli_reference_is_current():
    current = (ROOT / "docs" / "cli.md").read_text()
    assert gen_docs.cli_markdown() == current, (
        "docs/cli.md is stale: run python docs/gen_docs.py and commit docs/cli.md")


def test_cli_reference_covers_every_command_at_80_columns():
    text = (ROOT / "docs" / "cli.md").read_text()
    for command in ("lip train", "lip certify", "lip lipschitz", "lip info", "lip export",
                    "lip plugins", "lip bench train", "lip bench certify", "lip bench profile"):
        assert f"## `{command}`" in text, command
    for block in re.findall(r"```text\n(.*?)```", text, re.DOTALL):
        for line in block.splitlines():
            assert len(line) <= 80, line


def test_label_smoothing_example_trains(tmp_path):
    """The loss example in docs/plugins.md is a working plugin: registered in-process, it
    trains a tiny model one step and its gradient reaches the weights."""
    spec_ = importlib.util.spec_from_file_location(
        "label_smoothing", ROOT / "docs" / "examples" / "label_smoothing.py")
    example = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(example)

    from lipcli.host.models import create_model
    from lipcli.host.plugins import create_host
    from lipcli.testing import check_component_spec

    registry = create_host(autoload=False, extra=[("smooth", example)]).registry()
    loss_spec = registry.get("loss", "smooth-ce")
    check_component_spec(loss_spec)
    model = create_model("lipconvnet-5", width=4, registry=registry)
    context = LossContext(model=model, num_classes=10, dataset="digits",
                          mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    with pytest.raises(ValueError):
        loss_spec.factory(context, smoothing=1.0)
    loss = loss_spec.factory(context, **loss_spec.resolve_params({"smoothing": 0.2}))
    images, labels = torch.rand(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    out = loss(model, images, labels)
    assert isinstance(out, LossOutput) and out.loss.dim() == 0 and out.logits.shape == (4, 10)
    out.loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_convolution_example_conforms(tmp_path):
    """The convolution example in docs/plugins.md is a working plugin on ``LipConvBase``: it
    passes lipcli.testing's convolution checks, its network bound covers the Jacobian, it
    survives a model file, and its export stand-in is the layer, baked, in aten operations."""
    spec_ = importlib.util.spec_from_file_location(
        "frobenius_conv", ROOT / "docs" / "examples" / "frobenius_conv.py")
    example = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(example)

    from lipcli.testing import (
        check_aten_program,
        check_conv_network_bound,
        check_conv_spec,
        check_export_follows,
        check_export_module,
        check_model_roundtrip,
        plugin_registry,
        randomise_parameters,
    )

    (spec,) = example.lip_convolutions()
    reports = check_conv_spec(spec)
    assert all(0 < r.sigma_max <= r.bound <= 1 + 1e-6 for r in reports)
    registry = plugin_registry(("fnorm", example))
    bound, norm = check_conv_network_bound("fnorm", registry=registry, width=2, points=1)
    assert 0 < norm <= bound
    report = check_model_roundtrip(conv="fnorm", registry=registry, directory=tmp_path)
    assert report.config["conv"]["name"] == "fnorm"
    layer = randomise_parameters(example.FrobeniusConv(4, 8, 3, 2).double().eval(), seed=1)
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    check_export_module(layer, example.ExportedFrobeniusConv, x)
    check_export_follows(layer, lambda: layer.weight.add_(0.1), x)
    program = check_aten_program(layer.export_module(), x)
    torch.testing.assert_close(program(x), layer(x), rtol=1e-12, atol=1e-12)


def test_readme_is_an_entry_page():
    text = README.read_text()
    assert len(text.encode()) <= 6 * 1024, f"README.md is {len(text.encode())} bytes (at most 6 KiB)"
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    assert blocks[0].startswith("python3 -m venv .venv && .venv/bin/pip install -q -e . && "
                                ".venv/bin/lip train --dataset digits")
    assert blocks[1].strip() == "bash .ci/run"
    for link in ("docs/plugins.md", "docs/cli.md", "docs/spec.md", "docs/results.md",
                 "docs/benchmarks.md", "plugins/"):
        assert f"]({link}" in text, f"README does not link {link}"


@pytest.mark.parametrize("doc", ["README.md", "docs/plugins.md", "docs/guide.md", "docs/benchmarks.md"])
def test_relative_links_exist(doc):
    path = ROOT / doc
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{doc} links to missing {target}"


def _docs_text() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))


def test_every_raw_report_belongs_to_a_figure():
    """docs/data holds one raw report per current figure: each is named by a doc."""
    docs = _docs_text()
    orphans = [p.name for p in sorted((ROOT / "docs" / "data").iterdir()) if p.name not in docs]
    assert not orphans, f"docs/data files no doc refers to (superseded? delete them): {orphans}"


def _scripts(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).iterdir() if p.is_file() and p.name != "README.md")


def test_every_benchmark_script_is_a_reproduction_script():
    """benchmarks/ keeps only scripts a doc refers to (or that such a script runs)."""
    scripts = _scripts("benchmarks")
    docs = _docs_text()
    used = "\n".join(p.read_text() for p in scripts if p.name in docs)
    unused = [p.name for p in scripts if p.name not in docs and p.name not in used]
    assert not unused, f"benchmarks/ scripts no doc refers to (tooling goes to tools/): {unused}"


@pytest.mark.parametrize("folder", ["benchmarks", "tools"])
def test_every_script_has_a_line_in_its_folder_readme(folder):
    readme = (ROOT / folder / "README.md").read_text()
    missing = [p.name for p in _scripts(folder) if f"`{p.name}`" not in readme]
    assert not missing, f"{folder}/README.md does not list {missing}"


_SCRIPT_PATH = re.compile(r"(?<![\w/.-])((?:benchmarks|tools)/[\w.-]+\.(?:py|sh))")


def test_every_named_script_path_exists():
    """A command quoted in a doc, test, script or pyproject names a script that is there."""
    sources = [README, ROOT / "pyproject.toml", *sorted((ROOT / "docs").glob("*.md")),
               *_scripts("benchmarks"), *_scripts("tools"), *sorted((ROOT / "tests").rglob("*.py"))]
    named = {(src.relative_to(ROOT).as_posix(), path) for src in sources
             for path in _SCRIPT_PATH.findall(src.read_text())}
    assert any(path == "tools/check_wheel.sh" for _, path in named)
    missing = sorted((src, path) for src, path in named if not (ROOT / path).is_file())
    assert not missing, f"scripts named but not in the tree: {missing}"
