"""lip train's options and help texts read from the plugin registry (issue 25 item 1): a loss
parameter's shortcut option is made from its spec (``Param.shortcut``), never written in the
core."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from lipcli.cli import app
from lipcli.cli.registry_options import listed_help, shortcut_options
from lipcli.host.plugins import get_registry
from lipcli.sdk.specs import HeadSpec, LossSpec, Param

runner = CliRunner()


class _Registry:
    """The two lookups the CLI makes, over hand-made specs."""

    def __init__(self, *specs):
        self.specs = {(s.kind, s.name): s for s in specs}

    def names(self, kind):
        return sorted(name for k, name in self.specs if k == kind)

    def get(self, kind, name):
        return self.specs[kind, name]


def _loss(name, *params, grad_clip=0.0):
    return LossSpec(name=name, factory=lambda context, **kw: None, description=name, params=params,
                    grad_clip=grad_clip)


def test_shortcut_options_are_made_from_the_specs():
    reg = _Registry(
        _loss("a", Param(name="knob", type=float, default=1.0, help="how hard", shortcut="knob_weight")),
        _loss("b", Param(name="k", type=float, default=0.0, help="b's knob", shortcut="knob_weight"),
              Param(name="plain", type=int, default=1), grad_clip=2.5),
        HeadSpec(name="h", factory=lambda *a, **k: None, description="h", certificate="c", loss="b"),
    )
    (option,) = shortcut_options(reg)
    assert option.name == "knob_weight" and option.opts == ["--knob-weight"]
    assert option.help == "Sets the loss parameter knob of a: how hard; k of b: b's knob."
    assert option.default is None
    texts = listed_help(reg)
    assert "a, b or a plugin's" in texts["loss"] and "(h: b)" in texts["loss"]
    assert texts["head"] == "Head: h (trained with b)."
    assert "2.5 for b, off otherwise" in texts["grad_clip"]
    assert shortcut_options(_Registry(_loss("c", Param(name="x", type=int, default=0)))) == []


def test_train_help_lists_the_installed_shortcuts():
    r = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert r.exit_code == 0, r.output
    radius = get_registry().get("loss", "crc-lip").param("radius")
    assert f"Sets the loss parameter radius of crc-lip: {radius.help}." in " ".join(r.stdout.split())
    for flag in ("--curvature-weight", "--attack-steps", "--curvature-power-steps", "--curvature-classes"):
        assert flag in r.stdout
    assert r.stdout.index("--curvature-classes") < r.stdout.index("--grad-clip")
    # typed as the parameter: a float option refuses text before anything runs
    bad = runner.invoke(app, ["train", "--attack-radius", "wide"])
    assert bad.exit_code == 2 and "--attack-radius" in bad.output and "number" in bad.output


def test_lip_help_stays_torch_free():
    code = ("import sys; from lipcli.cli import main; sys.argv = ['lip', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nassert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "train" in out.stdout
