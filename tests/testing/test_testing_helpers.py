"""The plugin-author conformance checks in lipcli.testing: they pass on the built-in pools
and FAIL (AssertionError naming the problem) on deliberately broken components."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lipcli.builtins.pooling.plugin import lip_pools as builtin_pools
from lipcli.sdk.errors import UnknownComponentError
from lipcli.sdk.hookspecs import hookimpl
from lipcli.host.plugins import create_host
from lipcli.sdk.specs import ONE_LIPSCHITZ, ActivationSpec, HeadSpec, Param, PoolSpec
from lipcli.testing import (
    check_component_spec,
    check_model_roundtrip,
    check_one_lipschitz,
    check_pool_spec,
)

BUILTIN_POOLS = {spec.name: spec for spec in builtin_pools()}


def _pool_spec(factory, name: str = "broken", params=(), promises=(ONE_LIPSCHITZ,)) -> PoolSpec:
    return PoolSpec(name=name, factory=factory, description="a test pool", params=params,
                    promises=promises)


class ScaledMax(nn.Module):
    """``scale * max(a, b)``: (scale)-Lipschitz."""

    def __init__(self, channels: int, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        c = z.shape[1] // 2
        return self.scale * torch.maximum(z[:, :c], z[:, c:])


# --- built-ins pass ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["max", "projection"])
def test_builtin_pools_pass(name):
    report = check_pool_spec(BUILTIN_POOLS[name], channels=8)
    lip = report.lipschitz
    assert lip is not None
    assert lip.max_pair_ratio <= 1 + 1e-9 and lip.max_jacobian_norm <= 1 + 1e-9
    # the checks actually probe the bound: both pools are exactly 1-Lipschitz and tight
    assert lip.max_jacobian_norm > 0.999
    assert lip.max_attack_ratio > 0.99


def test_builtin_pool_specs_pass_component_check():
    for spec in BUILTIN_POOLS.values():
        check_component_spec(spec)


# --- broken pools fail ------------------------------------------------------------------------
def test_twice_scaled_pool_fails_lipschitz():
    spec = _pool_spec(lambda channels: ScaledMax(channels, 2.0))
    with pytest.raises(AssertionError, match="not 1-Lipschitz"):
        check_pool_spec(spec, channels=8)


def test_slightly_scaled_pool_fails_lipschitz():
    spec = _pool_spec(lambda channels: ScaledMax(channels, 1.01))
    with pytest.raises(AssertionError, match="not 1-Lipschitz"):
        check_pool_spec(spec, channels=8)


def test_scaled_pool_without_promise_is_not_lipschitz_checked():
    spec = _pool_spec(lambda channels: ScaledMax(channels, 2.0), promises=())
    assert check_pool_spec(spec, channels=8).lipschitz is None


class JumpPool(nn.Module):
    """max(a, b) plus a jump of 0.5 where a > 3: gradient norm <= 1 a.e. but discontinuous."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        c = z.shape[1] // 2
        a, b = z[:, :c], z[:, c:]
        return torch.maximum(a, b) + 0.5 * (a > 3).to(z.dtype)


def test_discontinuous_pool_fails_on_pairs():
    with pytest.raises(AssertionError, match="random pair"):
        check_one_lipschitz(JumpPool(), (8, 2, 2), attack_steps=0, jacobian_points=0,
                            name="jump")


def test_locally_expanding_map_is_found():
    """1-Lipschitz except slope 1.2 on a small interval: found by pairs/ascent/Jacobian."""

    def fn(z: torch.Tensor) -> torch.Tensor:
        return z + 0.2 * (z.clamp(0.5, 0.6) - 0.5)

    with pytest.raises(AssertionError, match="not 1-Lipschitz"):
        check_one_lipschitz(fn, (4, 2, 2), name="bump")


class WrongShapePool(nn.Module):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z


def test_wrong_shape_fails():
    with pytest.raises(AssertionError, match=r"\(N, C/2, H, W\)"):
        check_pool_spec(_pool_spec(lambda channels: WrongShapePool()), channels=8)


class NoisyPool(ScaledMax):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return super().forward(z) + 1e-3 * torch.rand_like(z[:, : z.shape[1] // 2])


def test_nondeterministic_pool_fails():
    with pytest.raises(AssertionError, match="deterministic"):
        check_pool_spec(_pool_spec(lambda channels: NoisyPool(channels, 1.0)), channels=8)


class UnsavedStatePool(nn.Module):
    """Adds a random per-instance offset held in a plain attribute (not in the state dict)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.offset = torch.randn(channels // 2, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        c = z.shape[1] // 2
        return torch.maximum(z[:, :c], z[:, c:]) + self.offset.to(z.dtype)


def test_state_outside_state_dict_fails_roundtrip():
    with pytest.raises(AssertionError, match="round trip"):
        check_pool_spec(_pool_spec(UnsavedStatePool), channels=8)


class BadNoDecayPool(ScaledMax):
    no_weight_decay = ("theta",)


def test_no_weight_decay_must_name_parameters():
    with pytest.raises(AssertionError, match="no_weight_decay"):
        check_pool_spec(_pool_spec(lambda channels: BadNoDecayPool(channels, 1.0)), channels=8)


class NaNGradPool(nn.Module):
    """sqrt(a^2 + b^2): NaN gradient at the origin (hit by a zero input)."""

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        c = z.shape[1] // 2
        return torch.sqrt(z[:, :c] ** 2 + z[:, c:] ** 2)


def test_nonfinite_jacobian_at_origin_is_reported():
    # the norm pool is 1-Lipschitz, but its Jacobian at 0 is NaN: check a zero input
    with pytest.raises(AssertionError, match="non-finite"):
        check_one_lipschitz(lambda z: NaNGradPool()(z * 0.0), (2, 1, 1), pairs=8,
                            attack_steps=0, jacobian_points=1, name="norm-at-0")


def test_pool_params_are_validated():
    spec = _pool_spec(lambda channels, *, k=2: ScaledMax(channels, 1.0),
                      params=(Param(name="k", type=int, default=2, choices=(2, 3)),))
    check_pool_spec(spec, channels=4, params={"k": 3}, pairs=32, attack_steps=2)
    with pytest.raises(AssertionError, match="do not validate"):
        check_pool_spec(spec, channels=4, params={"k": 5})


# --- component specs --------------------------------------------------------------------------
def _act(**changes) -> ActivationSpec:
    fields = dict(name="ok", factory=lambda channels: nn.Identity(), description="fine")
    fields.update(changes)
    return ActivationSpec(**fields)


def test_component_spec_ok():
    check_component_spec(_act(params=(Param(name="alpha", type=float, default=0.1),
                                      Param(name="flag", type=bool, default=False)),
                              factory=lambda channels, *, alpha=0.1, flag=False: nn.Identity()))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(params=(Param(name="k", type=int, default=5, choices=(1, 2)),)), "default"),
        (dict(params=(Param(name="k", type=int, default="3"),)), "default"),
        (dict(description="  "), "description"),
        (dict(description="two\nlines"), "one line"),
        (dict(name="a:b"), "name"),
        (dict(promises=("1-lipschitz", "")), "promises"),
        (dict(promises=["1-lipschitz"]), "promises"),
        (dict(params=(Param(name="k", type=int, default=1),)), "factory cannot be called"),
        (dict(factory=lambda: nn.Identity()), "factory cannot be called"),
    ],
)
def test_component_spec_failures(changes, message):
    with pytest.raises(AssertionError, match=message):
        check_component_spec(_act(**changes))


def test_head_spec_needs_signature_with_two_positionals():
    head = HeadSpec(name="h", factory=lambda in_features: nn.Identity(), description="x",
                    certificate="lln")
    with pytest.raises(AssertionError, match="factory cannot be called"):
        check_component_spec(head)


# --- model round trip -------------------------------------------------------------------------
NEEDED = {"arch": "lipconvnet-5", "conv": "soc-fast", "activation": "maxmin", "head": "lln"}


def _registry(extra=()):
    return create_host(autoload=False, extra=extra).registry()


def _require_model_components(reg) -> None:
    """The built-ins these checks use ship with lipcli: missing is a failure, not a skip."""
    missing = [f"{k} {n}" for k, n in NEEDED.items() if n not in reg.names(k)]
    assert not missing, f"built-in model components missing: {', '.join(missing)}"


@pytest.mark.parametrize("pool", ["max", "projection"])
def test_model_roundtrip_builtin_pools(pool, tmp_path):
    reg = _registry()
    _require_model_components(reg)
    report = check_model_roundtrip(pool=pool, registry=reg, directory=tmp_path)
    assert report.logits_shape == (2, 10)
    assert report.config["pool"]["name"] == pool
    assert report.config["pool"]["distribution"] == "lipcli"


class _UnsavedStatePlugin:
    @hookimpl
    def lip_pools(self):
        return [_pool_spec(UnsavedStatePool, name="unsaved")]


def test_model_roundtrip_catches_unsaved_state(tmp_path):
    reg = _registry(extra=[("unsaved-plugin", _UnsavedStatePlugin())])
    _require_model_components(reg)
    with pytest.raises(AssertionError, match="logits differ"):
        check_model_roundtrip(pool="unsaved", registry=reg, directory=tmp_path)


def test_model_roundtrip_unknown_component():
    with pytest.raises(UnknownComponentError):
        check_model_roundtrip(pool="no-such-pool", registry=_registry())


def test_every_builtin_spec_passes_component_check():
    reg = _registry()
    from lipcli.host.plugins import KIND_TITLES

    for kind in KIND_TITLES:
        for spec in reg.specs(kind):
            check_component_spec(spec)


def test_activation_conformance_on_maxmin_and_a_leaky_relu():
    from lipcli.builtins.activations.plugin import lip_activations
    from lipcli.sdk.specs import ONE_LIPSCHITZ, ActivationSpec
    from lipcli.testing import check_activation_spec

    (maxmin,) = lip_activations()
    report = check_activation_spec(maxmin, channels=8, gradient_norm_preserving=True)
    assert report.singular_values == pytest.approx((1.0, 1.0), abs=1e-12)
    # 1-Lipschitz but not gradient-norm preserving: the first check passes, the second fails
    leaky = ActivationSpec(
        name="leaky", factory=lambda channels: torch.nn.LeakyReLU(0.1),
        description="leaky ReLU", promises=(ONE_LIPSCHITZ,),
    )
    assert check_activation_spec(leaky, channels=4).lipschitz is not None
    with pytest.raises(AssertionError, match="not gradient-norm preserving"):
        check_activation_spec(leaky, channels=4, gradient_norm_preserving=True)
    # shape changes are caught
    halving = ActivationSpec(
        name="halving", factory=lambda channels: torch.nn.MaxPool3d((2, 1, 1)),
        description="not shape preserving",
    )
    with pytest.raises(AssertionError, match="keep the shape"):
        check_activation_spec(halving, channels=4)
