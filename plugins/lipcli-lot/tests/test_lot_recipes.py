"""The recipes of lipcli-lot against the authors' code (AI-secure/Layerwise-Orthogonal-Training at 65f7ea4): each value and the file
and key it was read from (a table), and each recipe resolves to installed components."""

from __future__ import annotations

import pytest

from lipcli.testing import check_recipe, recipe_table
from lipcli_lot.plugin import lip_recipes
from lipcli_lot.recipes import COMMIT, REPO

LOT = [
    ('arch', 'lipconvnet-5:width=32', 'train_robust.py', '--block-size 1, --init-channels 32; lines 40, 43'),
    ('conv', 'lot:iterations=10', 'train_robust.py', '--conv-layer lot, line 38'),
    ('activation', 'maxmin', 'train_robust.py', '--activation, line 41'),
    ('head', 'lln', 'README.md', '--lln, line 17'),
    ('loss', 'ce', 'train_robust.py', '--gamma 0: plain cross-entropy, lines 30, 189'),
    ('dataset', 'cifar10', 'train_robust.py', '--dataset, line 51'),
    ('epochs', 200, 'train_robust.py', '--epochs, line 25'),
    ('batch_size', 256, 'train_robust.py', '--batch-size, line 24'),
    ('optimizer', 'sgd', 'train_robust.py', 'torch.optim.SGD, line 146'),
    ('lr', 0.1, 'train_robust.py', '--lr-max, line 27'),
    ('momentum', 0.9, 'train_robust.py', '--momentum, line 29'),
    ('weight_decay', 0.0, 'train_robust.py', 'weight_decay=0. for layers other than SOC, lines 146-147'),
    ('schedule', 'step', 'train_robust.py', 'MultiStepLR, line 156'),
    ('lr_milestones', [0.5, 0.75], 'train_robust.py', 'lr_steps // 2, 3 * lr_steps // 4; lines 156-157'),
    ('lr_gamma', 0.1, 'train_robust.py', 'gamma=0.1, line 157'),
    ('grad_clip', 0.0, 'train_robust.py', 'no gradient clipping in the training loop, lines 178-200'),
    ('amp', False, 'README.md', '--opt-level O0, lines 11, 16'),
    ('seed', 0, 'train_robust.py', '--seed, line 57'),
    ('augment', True, 'utils.py', 'RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 29-30'),
]

TABLES = {"lot": LOT, "lot-residual": LOT}
#: distributions besides lipcli-lot whose components the recipes name
NEEDS = []


def _recipes():
    return {spec.name: spec for spec in lip_recipes()}


def test_the_recipes_shipped():
    assert sorted(_recipes()) == sorted(TABLES)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_values_and_sources_are_the_authors(name):
    spec = _recipes()[name]
    assert recipe_table(spec) == TABLES[name]
    assert {(s.repo, s.commit) for s in spec.sources.values()} == {(REPO, COMMIT)}
    assert spec.version == "1" and spec.pending, "the authors' settings lipcli lacks are listed"


@pytest.mark.parametrize("name", sorted(TABLES))
def test_it_resolves_to_installed_components(name):
    for module in NEEDS:
        pytest.importorskip(module, reason=f"recipe {name} names components of {module}")
    settings = check_recipe(_recipes()[name])
    assert settings == {key: value for key, value, _, _ in TABLES[name]}


def test_the_residual_recipe_differs_only_in_the_pending_residual_form():
    plain, residual = _recipes()["lot"], _recipes()["lot-residual"]
    assert residual.values == plain.values and residual.sources == plain.sources
    assert "--residual" in residual.pending[0] and set(plain.pending) < set(residual.pending)
