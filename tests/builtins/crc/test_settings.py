"""The crc-lip parameters are written once (lipcli.builtins.crc.settings): the certificate
spec, the certifier's keyword defaults and the dual solver all read CRCSettings."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from crc_helpers import MLP
from lipcli.builtins.crc.certifier import CRCCertifier
from lipcli.builtins.crc.plugin import lip_certificates
from lipcli.builtins.crc.settings import CRCSettings
from lipcli.sdk.certificates import Certifier


def test_hook_and_protocol():
    (spec,) = lip_certificates()
    assert spec.name == "crc-lip"
    cert = spec.factory(**spec.resolve_params({"curvature": "global", "dual": False}))
    assert isinstance(cert, Certifier)
    assert cert.curvature == "global" and not cert.dual


def test_spec_params_and_certifier_defaults_are_the_settings_fields():
    (spec,) = lip_certificates()
    fields = {f.name: f for f in dataclasses.fields(CRCSettings)}
    assert [p.name for p in spec.params] == list(fields)  # cg_max_iter included
    for p in spec.params:
        assert p.default == fields[p.name].default
        assert p.help == fields[p.name].metadata["help"] and p.help
    signature = inspect.signature(CRCCertifier)
    assert {n: q.default for n, q in signature.parameters.items()} == {
        n: f.default for n, f in fields.items()
    }
    assert CRCCertifier().settings == CRCSettings()


def test_every_param_reaches_the_certifier():
    (spec,) = lip_certificates()
    cert = spec.factory(**spec.resolve_params({"cg_max_iter": 1, "solver_dtype": "float64"}))
    assert cert.settings.cg_max_iter == 1
    assert cert.settings.torch_solver_dtype == torch.float64
    # cg_max_iter really bounds the CG solves: one operator application per row and step
    head = MLP(4, 10, 3, scale=3.0, seed=12)
    y = torch.randn(6, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    capped = cert.certify(head, y).stats
    free = CRCCertifier(solver_dtype="float64").certify(head, y).stats
    assert capped["hvps"] <= 2 * capped["newton_iters"] < free["hvps"]


@pytest.mark.parametrize("bad", [{"curvature": "some"}, {"boundary": 1.0}, {"solver_dtype": "float16"}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        CRCCertifier(**bad)
