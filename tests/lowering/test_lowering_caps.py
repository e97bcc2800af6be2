"""The eval lowering's one setting (lipcli.lowering.caps): its two defaults as the drivers read
them, its one check (one message, naming the setting, from every driver), its conversion to
bytes, and the context's other name kept for plugins."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from lipcli.certify.options import CertifyOptions
from lipcli.export import DENSE_MAX_MIB, ExportOptions, export_model
from lipcli.host.models import create_model
from lipcli.lowering import caps
from lipcli.lowering.network import default_dense_max_mib, lowered_network
from lipcli.sdk.errors import SettingError
from lipcli.sdk.lowering import LoweringContext

BAD = [-1.0, -1e-9, math.nan, math.inf, -math.inf, True, "3", None]


@pytest.mark.usefixtures("memo_soc_build")  # the tiny model other tests lower too
def test_the_two_defaults_are_the_ones_the_drivers_use() -> None:
    assert caps.EXPORT_DENSE_MAX_MIB == 32.0
    assert ExportOptions().dense_max_mib == DENSE_MAX_MIB == caps.EXPORT_DENSE_MAX_MIB
    assert ExportOptions().dense_max_bytes == 32 * 2**20
    assert caps.CERTIFY_DENSE_MAX_MIB == {"cpu": 256.0, "cuda": 256.0}
    assert caps.CERTIFY_DENSE_MAX_MIB_OTHER == 32.0
    assert default_dense_max_mib("cpu") == default_dense_max_mib("cuda:1") == 256.0
    assert default_dense_max_mib("meta") == caps.certify_dense_max_mib("mps") == 32.0
    assert caps.describe_certify_default() == "256 MiB on cpu and cuda, 32 MiB elsewhere"
    # lip certify's default (None) is the device's cap, as the lowered network records it
    assert CertifyOptions().dense_max_mib is None
    torch.manual_seed(0)
    model = create_model("lipconvnet-5", width=4).eval()
    assert lowered_network(model, dense_max_mib=CertifyOptions().dense_max_mib).dense_max_mib == 256.0


@pytest.mark.parametrize("value,expected", [(0, 0), (0.0, 0), (1, 2**20), (1.5, 3 * 2**19),
                                            (1e-6, 1), (32.0, 32 * 2**20)])
def test_mib_to_bytes(value: float, expected: int) -> None:
    caps.check_dense_max_mib(value)
    assert caps.dense_max_bytes(value) == expected == int(value * 2**20)


@pytest.mark.parametrize("value", BAD)
def test_one_check_one_message(value: object) -> None:
    with pytest.raises(SettingError) as raised:
        caps.check_dense_max_mib(value)  # type: ignore[arg-type]
    assert raised.value.setting == caps.SETTING == "dense_max_mib"
    message = str(raised.value)
    assert message.startswith("dense_max_mib must be a finite number of MiB >= 0 ")
    assert message.endswith(f"got {value!r}")
    with pytest.raises(SettingError, match="^dense_max_mib must be"):
        caps.dense_max_bytes(value)  # type: ignore[arg-type]


def test_none_is_the_default_only_where_one_exists() -> None:
    caps.check_dense_max_mib(None, default_allowed=True)
    with pytest.raises(SettingError):
        caps.check_dense_max_mib(None)


def _message(call) -> str:
    with pytest.raises(SettingError) as raised:
        call()
    assert raised.value.setting == "dense_max_mib"
    return str(raised.value)


def test_every_driver_reports_the_same_error(tmp_path) -> None:
    """lip certify's options, lip export (before the model file is even looked at) and the
    lowering itself (lip bench certify, the library) give the one message."""
    expected = _message(lambda: caps.check_dense_max_mib(-2.0))
    model = create_model("lipconvnet-5", width=4).eval()
    assert _message(lambda: CertifyOptions(dense_max_mib=-2.0).check()) == expected
    assert _message(lambda: export_model(tmp_path / "missing.pt",
                                         ExportOptions(dense_max_mib=-2.0))) == expected
    assert _message(lambda: lowered_network(model, dense_max_mib=-2.0)) == expected


def test_the_context_keeps_its_other_name_for_plugins() -> None:
    from lipcli.sdk.export import ExportContext

    assert ExportContext is LoweringContext
    context = ExportContext((3, 4, 4), caps.dense_max_bytes(1.0))
    assert context == LoweringContext((3, 4, 4), 2**20, None)


def test_the_caps_load_without_torch() -> None:
    """Help texts and options read the caps; importing them imports no torch."""
    code = ("import sys\n"
            "import lipcli.lowering as lowering, lipcli.export.options, lipcli.certify.options\n"
            "assert lowering.EXPORT_DENSE_MAX_MIB == 32.0 and lowering.describe_certify_default()\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
