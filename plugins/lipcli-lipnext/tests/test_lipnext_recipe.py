"""The recipe ``lipnext``: sourced, resolvable, and the values the paper states (L32W1024,
shift ratio 1/8, EMMA, bfloat16, so-adam) with LiResNet's schedule."""

from __future__ import annotations

from lipcli.testing import check_recipe, get_registry
from lipcli_lipnext.plugin import lip_recipes


def test_the_recipe_resolves_and_states_the_papers_values():
    (spec,) = lip_recipes()
    settings = check_recipe(spec)
    assert settings["arch"].startswith("lipnext:depth=32,width=1024,") and "shift_ratio=0.125" in settings["arch"]
    assert settings["optimizer"].startswith("so-adam:") and settings["loss"].startswith("emma:")
    assert settings["amp"] is True and settings["lr"] == 1e-3 and settings["lookahead"] == 6
    reg = get_registry()
    for kind in ("arch", "optimizer", "loss", "head"):
        reg.component(kind, settings[kind])  # every choice resolves with its parameters
    (row,) = spec.reported
    assert (row.clean, row.certified["36/255"], row.certified["108/255"]) == (81.5, 71.2, 45.9)
