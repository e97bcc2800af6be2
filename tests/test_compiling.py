"""lipcli.compiling: the --compile settings and :class:`Compiled` (compile time kept apart)."""

from __future__ import annotations

import pytest
import torch

from lipcli.compiling import (AUTO_COMPILE, BACKEND_ENV, COMPILE_MODES, Compiled, check_compile_mode,
                              compile_record, compiled_or_none, resolve_compile)
from lipcli.sdk.errors import LipError


def test_modes_and_the_per_device_default():
    assert COMPILE_MODES == ("default", "reduce-overhead", "max-autotune")
    assert check_compile_mode(" Max-Autotune ") == "max-autotune"
    with pytest.raises(ValueError, match="compile-mode must be one of default, reduce-overhead"):
        check_compile_mode("fast")
    assert resolve_compile(True, "reduce-overhead", "cpu") == "reduce-overhead"
    assert resolve_compile(False, "default", "cpu") == "off"
    # not given: the measured per-device choice (CPU measured slower compiled: eager)
    assert AUTO_COMPILE["cpu"] is False and resolve_compile(None, "default", "cpu") == "off"
    assert compiled_or_none(torch.sin, None, "default", "cpu") is None
    assert compile_record(None, "default", "cpu", None) == {"setting": "auto", "mode": "off"}


def test_compiled_step_equals_eager_and_counts_its_compile_time_apart(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "aot_eager")  # real tracing and AOTAutograd, no code generation
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    compiled = compiled_or_none(net, True, "default", "cpu")
    assert isinstance(compiled, Compiled)
    x = torch.randn(4, 6)
    for step in range(3):
        with compiled.measure():
            out = compiled(x)
            out.square().sum().backward()
        grads = [p.grad.clone() for p in net.parameters()]
        net.zero_grad()
        ref = net(x)
        ref.square().sum().backward()
        assert torch.allclose(out, ref, atol=1e-6, rtol=0)
        assert all(torch.allclose(g, p.grad, atol=1e-6) for g, p in zip(grads, net.parameters()))
        net.zero_grad()
        if step == 0:
            first = compiled.compile_s
            assert first > 0 and compiled.compiling_steps == 1
    assert compiled.compile_s == first and compiled.steps == 3  # later steps compile nothing
    record = compiled.record()
    assert record["mode"] == "default" and record["backend"] == "aot_eager"
    assert record["torch_version"] == torch.__version__ and record["compiling_steps"] == 1


def test_a_compiler_failure_is_one_line_naming_the_way_out(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "no-such-backend")
    compiled = Compiled(torch.nn.Linear(2, 2), "default", "the training step")
    with pytest.raises(LipError) as info:
        compiled(torch.ones(1, 2))
    message = str(info.value)
    assert message.startswith("torch.compile (default) failed on the training step: ")
    assert message.endswith("run without it (--no-compile)") and "\n" not in message
