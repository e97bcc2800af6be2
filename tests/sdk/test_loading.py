"""``lipcli.sdk.loading``: the host tells components that a model file's tensors will replace
their initial state, and SOC then skips its construction-time power iteration -- without
changing the loaded model."""

from __future__ import annotations

import pytest
import torch

from lipcli.builtins.soc.layer import SOC
from lipcli.sdk.loading import loading_tensors, tensors_will_be_loaded


def test_flag_is_set_only_inside_the_block_even_after_an_error():
    assert not tensors_will_be_loaded()
    with loading_tensors():
        assert tensors_will_be_loaded()
    with pytest.raises(RuntimeError):
        with loading_tensors():
            raise RuntimeError("build failed")
    assert not tensors_will_be_loaded()


def _build(loading: bool) -> SOC:
    torch.manual_seed(0)
    if loading:
        with loading_tensors():
            return SOC(4, 4)
    return SOC(4, 4)


def test_soc_skips_init_power_iteration_only_when_loading():
    fresh, skipped = _build(False), _build(True)
    assert torch.equal(fresh.weight, skipped.weight)  # same random init
    # the fresh layer refined its vectors with power steps; the loading one kept the random start
    assert any(not torch.equal(getattr(fresh, f"power_u{r}"), getattr(skipped, f"power_u{r}")) for r in range(4))


def test_loaded_state_gives_the_same_module_either_way():
    source = _build(False)
    with torch.no_grad():
        source.weight.mul_(1.3)
    source.refresh(7)
    a, b = _build(False), _build(True)
    a.load_state_dict(source.state_dict())
    b.load_state_dict(source.state_dict())
    for m in (source, a, b):
        m.eval()
    x = torch.randn(2, 4, 6, 6)
    assert torch.equal(a(x), source(x)) and torch.equal(b(x), source(x))
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in source.state_dict())
