"""The recipe of lipcli-sll against the authors' code (araujoalexandre/Lipschitz-SLL-Networks at 87865db): each value and the file
and key it was read from (a table), and each recipe resolves to installed components."""

from __future__ import annotations

import pytest

from lipcli.testing import check_recipe, recipe_table
from lipcli_sll.plugin import lip_recipes
from lipcli_sll.recipes import COMMIT, REPO

SLL_SMALL = [
    ('arch', 'liresnet:block=conv,depth=20,width=45,dense=7', 'main.py', '--model-name small: n_conv 20, n_dense 7, w 45; lines 85-86'),
    ('conv', 'sll', 'core/models/layers.py', 'SDPBasedLipschitzConvLayer, lines 16-49'),
    ('head', 'lln', 'core/models/model.py', 'LinearNormalized, line 57'),
    ('loss', 'la:gamma=0.0,eps=0.0,temperature=0.25,offset=2.121320343559643', 'core/utils.py', 'LossXent (--loss xent, --offset, --temperature; main.py lines 39-42), lines 113-120'),
    ('dataset', 'cifar10', 'main.py', '--dataset, line 34'),
    ('epochs', 1000, 'main.py', '--epochs, line 38'),
    ('batch_size', 64, 'main.py', '--batch_size, line 55'),
    ('optimizer', 'adamw', 'main.py', '--optimizer adam, --wd 0; lines 43, 48'),
    ('lr', 0.01, 'main.py', '--lr, line 45'),
    ('weight_decay', 0.0, 'main.py', '--wd, line 48'),
    ('grad_clip', 0.0, 'main.py', '--gradient_clip_by_norm None, line 53'),
    ('augment', True, 'core/data/readers.py', 'RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 66-67'),
]

TABLES = {"sll-small": SLL_SMALL}
#: distributions besides lipcli-sll whose components the recipes name
NEEDS = ['lipcli_liresnet', 'lipcli_logit_annealing']


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
