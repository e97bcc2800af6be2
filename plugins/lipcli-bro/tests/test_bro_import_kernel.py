"""``lip import --from bronet-lipconvnet`` of BRONet's LipConvNet with ``--kernel 5`` (their code,
unmodified: ``tools/make_import_fixtures_options.py bronet-lipconvnet``), BRO and LOT layers:
the authors' logits, the arch's ``kernel`` read from the shapes; a kernel lipcli does not build
is refused naming the option."""

from __future__ import annotations

import pytest
import torch
from bro_fixture_data import DATA, check_matches, check_variant_refused, import_reports, record

from lipcli.testing import load_model

CASES = ["bronet_lipconvnet_k5_b1_w2_c10", "bronet_lipconvnet_lot_k5_b1_w2_c10"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    return import_reports(CASES, "bronet-lipconvnet", tmp_path_factory.mktemp("k5"))


@pytest.mark.parametrize("case", CASES)
def test_kernel_5_imports_the_authors_function(imported, case):
    report = imported[case]
    check_matches(report, record(case), 10)
    assert report.jacobian_norm <= report.bound
    model, mf = load_model(report.model_file)
    assert mf.metadata["config"]["arch"]["params"]["kernel"] == 5
    kernels = [int(m.kernel_size if isinstance(m.kernel_size, int) else m.kernel_size[0])
               for name, m in model.body.named_children() if name.endswith("_conv") or "_conv" in name]
    assert kernels[:4] == [5, 5, 5, 5] and kernels[4] == 1


def test_an_even_kernel_is_refused_by_name(tmp_path):
    def change(state):
        state["layer1.0.conv.weight"] = torch.zeros(*state["layer1.0.conv.weight"].shape[:2], 4, 4)
    check_variant_refused(CASES[0], "bronet-lipconvnet", change, "cannot import option kernel=4", tmp_path)
