"""The recipe of lipcli-liresnet against the authors' code (hukkai/liresnet at 0c0611a): each value and the file
and key it was read from (a table), and each recipe resolves to installed components."""

from __future__ import annotations

import pytest

from lipcli.testing import check_recipe, recipe_table
from lipcli_liresnet.plugin import lip_recipes
from lipcli_liresnet.recipes import COMMIT, REPO

LIRESNET = [
    ('arch', 'liresnet:depth=12,width=512,dense=8', 'configs/cifar10.yaml', 'model.depth, model.width; lines 2-3'),
    ('activation', 'maxmin', 'configs/cifar10.yaml', 'model.act_name MinMax, line 6'),
    ('head', 'lln', 'configs/cifar10.yaml', 'model.use_lln, line 4'),
    ('loss', 'emma:eps=0.1411764705882353', 'configs/cifar10.yaml', 'gloro.loss_type emma_loss, gloro.eps; lines 25-28'),
    ('dataset', 'cifar10', 'configs/cifar10.yaml', 'dataset.name, line 20'),
    ('epochs', 800, 'configs/cifar10.yaml', 'training.epochs, line 10'),
    ('batch_size', 256, 'configs/cifar10.yaml', 'training.batch_size, line 9'),
    ('warmup_epochs', 20.0, 'configs/cifar10.yaml', 'training.warmup_epochs, line 11'),
    ('lr', 0.001, 'configs/cifar10.yaml', 'training.lr, line 12'),
    ('weight_decay', 0.0, 'configs/cifar10.yaml', 'training.weight_decay, line 13'),
    ('grad_clip', 3.0, 'configs/cifar10.yaml', 'training.grad_clip, grad_clip_val; lines 14-15'),
    ('optimizer', 'nadam', 'configs/cifar10.yaml', 'training.nadam, line 16'),
    ('lookahead', 6, 'configs/cifar10.yaml', 'training.lookahead, line 17'),
    ('schedule', 'cosine', 'tools/scheduler.py', '_cosine_get_lr, lines 29-32'),
    ('augment', True, 'tools/dataset/cifar.py', 'RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 8-9'),
]

TABLES = {"liresnet": LIRESNET}
#: distributions besides lipcli-liresnet whose components the recipes name
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
