"""End to end with a real third-party distribution: plugins/lipcli-polygon-pool.

The plugin is pip-installed (``--target``, so the shared environment is untouched) and put on
PYTHONPATH of a real ``lip plugins`` subprocess: it is discovered through the ``lipcli``
entry-point group; it trains and certifies (in-process where the environment has it, see
:func:`plugin_sites.lip_using`), and a real process without it reports that with a hint.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from plugin_sites import install_plugins, lip as _lip, lip_using


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    return install_plugins(
        ["lipcli-polygon-pool"], tmp_path_factory.mktemp("polygon-site"),
        tmp_path_factory.mktemp("polygon-src"),
    )


def test_polygon_plugin_end_to_end(plugin_site, tmp_path):
    listed = _lip(["plugins", "--json"], site=plugin_site)
    assert listed.exit_code == 0, listed.stderr
    data = json.loads(listed.stdout)
    info = {p["name"]: p for p in data["plugins"]}["polygon"]
    assert info["distribution"] == "lipcli-polygon-pool" and info["version"] == "0.2.0"
    assert info["components"] == {"pool": ["polygon"]} and info["error"] is None

    model = tmp_path / "poly.safetensors"
    trained = lip_using(
        ["train", "--dataset", "digits", "--arch", "lipconvnet-5", "--width", "4",
         "--pool", "polygon:vertices=5", "--epochs", "1", "--batch-size", "32",
         "--limit-train", "64", "--limit-test", "32", "--no-lipschitz-estimate", "-q",
         "--out", str(model)],
        site=plugin_site, modules=("lipcli_polygon_pool",),
    )
    assert trained.exit_code == 0, trained.stderr
    from lipcli.host.modelfile import read_metadata

    pool = read_metadata(model)["config"]["pool"]
    assert pool["name"] == "polygon" and pool["params"]["vertices"] == 5
    assert pool["distribution"] == "lipcli-polygon-pool"

    cert = lip_using(["certify", str(model), "--radii", "36,72", "--limit", "32", "--json",
                      "--no-write", "-q"], site=plugin_site, modules=("lipcli_polygon_pool",))
    assert cert.exit_code == 0, cert.stderr
    summary = json.loads(cert.stdout)
    assert summary["total"] == 32 and summary["sound"] is True
    assert [r["radius_units"] for r in summary["radii"]] == [36.0, 72.0]

    # not installed at all: only where this environment lacks it (.ci/run installs it; the
    # message is checked on a hermetic registry in tests/host/test_modelfile.py)
    absent = [{}] if importlib.util.find_spec("lipcli_polygon_pool") is None else []
    for env in ({"LIPCLI_DISABLE_PLUGIN_AUTOLOAD": "1"}, *absent):
        site = plugin_site if env else None
        missing = _lip(["certify", str(model), "--limit", "8", "--no-write"], site=site,
                       extra_env=env)
        assert missing.exit_code == 1
        assert "Traceback" not in missing.stderr
        line = missing.stderr.strip()
        assert "\n" not in line, line
        if env:  # installed (on the path) but plugin loading is switched off: say so
            assert "is installed, but installed plugins are not loaded" in line, line
            assert "LIPCLI_DISABLE_PLUGIN_AUTOLOAD" in line, line
        else:
            assert "pip install lipcli-polygon-pool" in line, line
