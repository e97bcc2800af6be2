"""The plugin host: built-ins, in-process and entry-point plugins, and their failure modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import lipcli

from lipcli.sdk.hookspecs import hookimpl
from lipcli.sdk import hookspecs
from lipcli.host import plugins
from lipcli.cli import app
from lipcli.sdk.errors import DuplicateComponentError, LipUsageError, PluginError, UnknownComponentError
from lipcli.sdk.specs import (
    OptimizerSpec,
    AugmentationSpec,
    RecipeSource,
    RecipeSpec,
    ActivationSpec,
    ArchSpec,
    CertificateSpec,
    ConvSpec,
    DatasetSpec,
    HeadSpec,
    ImporterSpec,
    LossSpec,
    Param,
    PoolSpec,
)

ROOT = Path(__file__).resolve().parents[2]


def _factory(*args, **kwargs):
    return ("built", args, kwargs)


class AllHooksPlugin:
    """Implements every lip_* hook once, so each hook is exercised through the host."""

    @hookimpl
    def lip_convolutions(self):
        return [ConvSpec(name="t-conv", factory=_factory, description="test conv",
                         params=(Param(name="k", type=int, default=3),))]

    @hookimpl
    def lip_activations(self):
        return [ActivationSpec(name="t-act", factory=_factory, description="test act")]

    @hookimpl
    def lip_pools(self):
        return [PoolSpec(name="t-pool", factory=_factory, description="test pool",
                         promises=("1-lipschitz",))]

    @hookimpl
    def lip_heads(self):
        return [HeadSpec(name="t-head", factory=_factory, description="test head",
                         certificate="t-cert")]

    @hookimpl
    def lip_certificates(self):
        return [CertificateSpec(name="t-cert", factory=_factory, description="test cert")]

    @hookimpl
    def lip_architectures(self):
        return [ArchSpec(name="t-arch", factory=_factory, description="test arch")]

    @hookimpl
    def lip_datasets(self):
        return [DatasetSpec(name="t-data", factory=_factory, description="test data",
                            num_classes=3, needs_root=False)]

    @hookimpl
    def lip_losses(self):
        return [LossSpec(name="t-loss", factory=_factory, description="test loss")]

    @hookimpl
    def lip_augmentations(self):
        return [AugmentationSpec(name="t-augmentation", factory=_factory, description="test augmentation")]

    @hookimpl
    def lip_recipes(self):
        source = RecipeSource(repo="o/r", commit="0" * 40, path="train.py", key="--lr")
        return [RecipeSpec(name="t-recipe", version="1", paper="test paper", description="test recipe",
                           values={"lr": 0.5}, sources={"lr": source})]

    @hookimpl
    def lip_importers(self):
        return [ImporterSpec(name="t-import", factory=_factory, description="test importer",
                             source="example.org/t")]

    @hookimpl
    def lip_optimizers(self):
        return [OptimizerSpec(name="t-optim", factory=_factory, description="test optimiser", default_lr=0.1)]


@pytest.fixture()
def host():
    return plugins.create_host(autoload=False)


def test_builtins_register_like_external_plugins(host):
    reg = host.registry()
    builtin = [p for p in host.plugins.values() if p.builtin]
    assert builtin and all(p.distribution == "lipcli" for p in builtin)
    assert not host.errors
    for kind, name in [("conv", "soc-fast"), ("conv", "soc"), ("activation", "maxmin"),
                       ("pool", "max"), ("pool", "projection"), ("head", "lln"), ("head", "mlp"),
                       ("certificate", "lln"), ("certificate", "crc-lip"),
                       ("arch", "lipconvnet-5"), ("arch", "lipconvnet-40"), ("dataset", "digits"),
                       ("importer", "improved-l2")]:
        assert name in reg.names(kind), (kind, name)


def test_every_hook_is_exercised(host):
    host.register(AllHooksPlugin(), "all-hooks")
    reg = host.registry()
    seen = {kind: [n for n in reg.names(kind) if n.startswith("t-")] for kind in hookspecs.HOOK_KINDS.values()}
    assert all(len(v) == 1 for v in seen.values()), seen
    assert host.plugins["all-hooks"].components == {
        "conv": ["t-conv"], "activation": ["t-act"], "pool": ["t-pool"], "head": ["t-head"],
        "certificate": ["t-cert"], "arch": ["t-arch"], "dataset": ["t-data"],
        "loss": ["t-loss"], "augmentation": ["t-augmentation"], "recipe": ["t-recipe"], "importer": ["t-import"],
        "optimizer": ["t-optim"],
    }
    comp = reg.component("conv", "t-conv:k=5")
    assert comp.params == {"k": 5}
    assert comp.build(1, 2) == ("built", (1, 2), {"k": 5})


def test_component_choice_errors(host):
    reg = host.registry()
    with pytest.raises(UnknownComponentError) as exc:
        reg.component("pool", "maxx")
    assert "maxx" in str(exc.value) and "projection" in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.exit_code == 2
    with pytest.raises(LipUsageError, match="no parameter"):
        reg.component("conv", "soc-fast:nope=1")
    with pytest.raises(LipUsageError, match="expected int"):
        reg.component("conv", "soc-fast:train_terms=six")
    with pytest.raises(LipUsageError, match="key=value"):
        reg.component("conv", "soc-fast:train_terms")
    assert plugins.parse_component_choice(" mlp:hidden=64 ") == ("mlp", {"hidden": "64"})


def test_duplicate_name_names_both_providers(host):
    class Dup:
        @hookimpl
        def lip_pools(self):
            return [PoolSpec(name="max", factory=_factory, description="another max")]

    host.register(Dup(), "dup-plugin")
    with pytest.raises(DuplicateComponentError) as exc:
        host.registry()
    msg = str(exc.value)
    assert "lipcli.pooling" in msg and "dup-plugin" in msg and "'max'" in msg


def test_misspelt_hook_is_an_error(host):
    class Typo:
        @hookimpl
        def lip_pool(self):  # missing "s"
            return []

    with pytest.raises(PluginError, match="unknown hook 'lip_pool'"):
        host.register(Typo(), "typo")


def test_plugin_raising_in_hook_is_reported_and_others_work(host):
    class Broken:
        @hookimpl
        def lip_pools(self):
            raise RuntimeError("kaboom")

        @hookimpl
        def lip_activations(self):
            return [ActivationSpec(name="never-registered", factory=_factory, description="x")]

    host.register(Broken(), "broken")
    reg = host.registry()
    assert "kaboom" in host.plugins["broken"].error
    assert "never-registered" not in reg.names("activation")
    assert "max" in reg.names("pool")


def test_wrong_return_type_is_reported(host):
    class Wrong:
        @hookimpl
        def lip_pools(self):
            return [ActivationSpec(name="oops", factory=_factory, description="x")]

    host.register(Wrong(), "wrong")
    host.registry()
    assert "PoolSpec" in host.plugins["wrong"].error


def test_in_process_plugin_shows_in_lip_plugins_json():
    plugins.reset()
    try:
        plugins.register_plugin(AllHooksPlugin(), "in-process-test")
        result = CliRunner().invoke(app, ["plugins", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        names = {p["name"]: p for p in data["plugins"]}
        assert names["in-process-test"]["components"]["pool"] == ["t-pool"]
        pools = {c["name"]: c for c in data["components"]["pools"]}
        assert pools["t-pool"]["plugin"] == "in-process-test"
        assert pools["t-pool"]["promises"] == ["1-lipschitz"]
        table = CliRunner().invoke(app, ["plugins"])
        assert table.exit_code == 0 and "in-process-test" in table.stdout
    finally:
        plugins.reset()


def _make_distribution(tmp_path: Path, name: str, module_src: str, module: str) -> Path:
    """A minimal installed distribution (dist-info + module) importlib.metadata can find."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(module_src))
    info = site / f"{name.replace('-', '_')}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[lipcli]\n{module} = {module}\n")
    return site


def _run_lip(args, env_extra):
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-m", "lipcli", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_entry_point_plugin_is_discovered_and_broken_one_reported(tmp_path):
    good = """
        from lipcli.sdk.hookspecs import hookimpl
        from lipcli.sdk.specs import PoolSpec

        def _f(channels):
            raise NotImplementedError

        @hookimpl
        def lip_pools():
            return [PoolSpec(name="ep-pool", factory=_f, description="from an entry point")]
    """
    site = _make_distribution(tmp_path, "lipcli-ep-test", good, "lipcli_ep_test")
    _make_distribution(tmp_path, "lipcli-ep-broken", "raise ImportError('no such thing')\n",
                       "lipcli_ep_broken")
    env = {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = _run_lip(["plugins", "--json"], env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    by_name = {p["name"]: p for p in data["plugins"]}
    assert by_name["lipcli_ep_test"]["distribution"] == "lipcli-ep-test"
    assert by_name["lipcli_ep_test"]["version"] == "1.2.3"
    assert by_name["lipcli_ep_test"]["components"] == {"pool": ["ep-pool"]}
    assert "no such thing" in by_name["lipcli_ep_broken"]["error"]
    assert any(c["name"] == "max" for c in data["components"]["pools"])

    off = _run_lip(["plugins", "--json"], {**env, plugins.DISABLE_AUTOLOAD_ENV: "1"})
    assert off.returncode == 0, off.stderr
    names = {p["name"] for p in json.loads(off.stdout)["plugins"]}
    assert "lipcli_ep_test" not in names and "lipcli.soc" in names


def test_python_m_lipcli_help_and_version():
    out = subprocess.run([sys.executable, "-m", "lipcli", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "plugins" in out.stdout
    ver = subprocess.run([sys.executable, "-m", "lipcli", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert ver.stdout.strip() == f"lipcli {lipcli.__version__}"


def test_param_parsing():
    p = Param(name="flag", type=bool, default=False)
    assert p.parse("yes") is True and p.parse("0") is False
    with pytest.raises(ValueError):
        p.parse("maybe")
    f = Param(name="x", type=float, default=1.0)
    assert f.check(2) == 2.0
    with pytest.raises(ValueError):
        Param(name="n", type=int, default=1).check(True)
    with pytest.raises(TypeError):
        Param(name="bad", type=list, default=[])


class _BracketPlugin:
    """A plugin whose hook fails with rich-markup-looking text, and one with parameters."""

    @hookimpl
    def lip_pools(self):
        raise RuntimeError("needs extra [gpu] installed [/red]")


class _DuplicateMaxPlugin:
    @hookimpl
    def lip_pools(self):
        return [PoolSpec(name="max", factory=_factory, description="a second max")]


def test_lip_plugins_verbose_shows_parameters_as_plain_text():
    plugins.reset()
    try:
        plugins.get_host().register(_BracketPlugin(), "bracket-plugin")
        result = CliRunner().invoke(app, ["plugins", "-v"])
        assert result.exit_code == 0, result.output
        plain = "".join(result.stdout.replace("│", "").split())
        # parameters with their defaults (rich used to swallow "[name=default, ...]")
        assert "train_terms=6in2..64" in plain  # with its declared range
        assert "needsextra[gpu]installed[/red]" in plain  # error text verbatim, no markup
        quiet = CliRunner().invoke(app, ["plugins"])
        assert quiet.exit_code == 0 and "train_terms=6" not in "".join(quiet.stdout.split())
    finally:
        plugins.reset()


def test_lip_plugins_still_lists_everything_when_two_plugins_clash():
    plugins.reset()
    try:
        plugins.get_host().register(_DuplicateMaxPlugin(), "dup-max")
        result = CliRunner().invoke(app, ["plugins", "--json"])
        assert result.exit_code == 1
        data = json.loads(result.stdout)
        by_name = {p["name"]: p for p in data["plugins"]}
        # both providers show what they provide
        assert by_name["dup-max"]["components"] == {"pool": ["max"]}
        assert "max" in by_name["lipcli.pooling"]["components"]["pool"]
        assert any("'max' is provided twice" in c and "dup-max" in c for c in data["conflicts"])
        assert "lipcli.pooling" in result.stderr and "dup-max" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        table = CliRunner().invoke(app, ["plugins"])
        assert table.exit_code == 1 and "projection" in table.stdout
        # every other command refuses to run with an ambiguous name, and says the way out
        with pytest.raises(DuplicateComponentError, match=plugins.DISABLE_AUTOLOAD_ENV):
            plugins.get_registry()
    finally:
        plugins.reset()


def test_command_line_usage_errors_are_one_line_with_exit_2(monkeypatch, capsys):
    """The console entry point (``lipcli.cli.main``) turns parse errors into one line: the
    first case runs in a real ``python -m lipcli`` process, the others call the same
    ``main()`` in-process (same formatting, no interpreter start-up each)."""
    cases = (
        (["train", "--width", "abc"], "--width"),
        (["train", "--nosuchopt"], "--nosuchopt"),
        (["nosuchcmd"], "nosuchcmd"),
        (["certify"], "model"),
    )
    # (no runs directory: ``lip certify`` without MODEL would take the newest model there)
    no_runs = str(ROOT / "tests" / "no-such-runs-dir")
    for i, (args, needle) in enumerate(cases):
        if i == 0:
            out = subprocess.run([sys.executable, "-m", "lipcli", *args], capture_output=True,
                                 text=True, timeout=120, env={**os.environ, "LIPCLI_RUNS": no_runs})
            code, stderr = out.returncode, out.stderr
        else:
            from lipcli.cli import main

            monkeypatch.setenv("LIPCLI_RUNS", no_runs)
            monkeypatch.setattr(sys, "argv", ["lip", *args])
            capsys.readouterr()
            with pytest.raises(SystemExit) as exited:
                main()
            code, stderr = exited.value.code, capsys.readouterr().err
        assert code == 2, (args, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
        assert "Traceback" not in stderr


def test_two_distributions_with_the_same_plugin_name_are_both_reported(tmp_path):
    """Entry-point names identify plugins: a second distribution reusing one is shown as
    broken, naming both, instead of silently vanishing."""
    site = tmp_path / "site"
    site.mkdir()
    for dist, module, pool in (("lipcli-first", "first_mod", "first-pool"),
                               ("lipcli-second", "second_mod", "second-pool")):
        (site / f"{module}.py").write_text(textwrap.dedent(f"""
            from lipcli.sdk.hookspecs import hookimpl
            from lipcli.sdk.specs import PoolSpec

            @hookimpl
            def lip_pools():
                return [PoolSpec(name="{pool}", factory=lambda channels: None,
                                 description="test")]
        """))
        info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[lipcli]\nsamename = {module}\n")
    out = _run_lip(["plugins", "--json"],
                   {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    named = [p for p in data["plugins"] if p["name"].startswith("samename")]
    assert len(named) == 2, named
    broken = [p for p in named if p["error"]]
    assert len(broken) == 1 and "already used by plugin 'samename'" in broken[0]["error"]
    assert {p["distribution"] for p in named} == {"lipcli-first", "lipcli-second"}


def test_register_and_unregister_an_in_process_plugin():
    plugins.reset()
    try:
        plugins.register_plugin(AllHooksPlugin(), "in-process-tmp")
        assert "t-pool" in plugins.get_registry().names("pool")
        plugins.unregister_plugin("in-process-tmp")
        assert "t-pool" not in plugins.get_registry().names("pool")
        assert "in-process-tmp" not in plugins.get_host().plugins
    finally:
        plugins.reset()
