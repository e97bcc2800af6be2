"""Values that can only be typos or leftovers are refused in one line, exit 2, before any
work (``lipcli.train.config`` limits, the launch environment, an augmentation's bounds)."""

from __future__ import annotations

import pytest

from lipcli.testing import run_lip
from lipcli.train.config import MAX_SEED, max_workers

BASE = ["train", "--dataset", "digits", "--epochs", "1", "--limit-train", "8", "--limit-test", "8"]


def _refused(tmp_path, args, message, env=None):
    out = tmp_path / "m.safetensors"
    result = run_lip([*BASE, *args, "--out", str(out)], env=env)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and message in lines[0], result.output
    assert not out.exists() and not any(p.name.endswith("-run") for p in tmp_path.iterdir())


@pytest.mark.parametrize("args, message", [
    (["--lr", "1e300"], "--lr must be in (0, 1e+30], got 1e+300"),
    (["--seed", str(MAX_SEED + 1)], "--seed must be in 0..18446744073709551615"),
    (["--workers", "10000"], f"--workers must be at most {max_workers()}"),
    (["--augmentation", "color-jitter:contrast_min=3,contrast_max=1"], "contrast_min must be at most contrast_max"),
], ids=["lr", "seed", "workers", "jitter"])
def test_options(tmp_path, args, message):
    _refused(tmp_path, args, message)


@pytest.mark.parametrize("line, message", [
    ("weight_decay = 1e300", "--weight-decay must be in [0, 10], got 1e+300"),
    ("lr_gamma = 1e300", "lr_gamma must be in (0, 10], got 1e+300"),
    ("workers = 10000", f"--workers must be at most {max_workers()}"),
], ids=["weight_decay", "lr_gamma", "workers"])
def test_settings_file(tmp_path, line, message):
    (tmp_path / "s.toml").write_text(line + "\n")
    _refused(tmp_path, ["--config", str(tmp_path / "s.toml")], message)


@pytest.mark.parametrize("env, message", [
    ({"RANK": "5"}, "the environment sets RANK=5 but no launcher started this process"),
    ({"RANK": "1", "WORLD_SIZE": "8"}, "RANK=1, WORLD_SIZE=8 but no launcher"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE=two, not a non-negative integer"),
], ids=["rank", "world", "garbage"])
def test_a_launch_environment_without_a_launcher(tmp_path, monkeypatch, env, message):
    for key in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    _refused(tmp_path, [], message, env=env)


def test_an_architecture_beyond_the_machine_is_refused_before_it_is_built(tmp_path):
    from lipcli.host.modelcheck import BuildTooLarge, budgeted_build
    from lipcli.host.models import create_model

    with pytest.raises(BuildTooLarge) as exc:  # ~150 GiB of residual filters: refused, not allocated
        budgeted_build(lambda: create_model("liresnet", width=4096, depth=256), 64 << 20)
    assert exc.value.requested > 64 << 20
    assert budgeted_build(lambda: create_model("lipconvnet-5", width=4), 1 << 30) is not None
    out = tmp_path / "m.safetensors"
    result = run_lip([*BASE, "--arch", "liresnet:depth=256,width=4096", "--out", str(out)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "out of memory in the model build" in lines[0]
    assert not out.exists()
