"""The recipes of lipcli-bro against the authors' code (ntuaislab/BRONet at 9d59c9b): each value and the file
and key it was read from (a table), and each recipe resolves to installed components."""

from __future__ import annotations

import pytest

from lipcli.testing import check_recipe, recipe_table
from lipcli_bro.plugin import lip_recipes
from lipcli_bro.recipes import COMMIT, REPO

BRONET = [
    ('arch', 'liresnet:depth=12,width=512,block=conv,dense=8', 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'model.depth, width, backbone_type, linear_num; lines 2-3, 8, 17'),
    ('conv', 'bro:rank_ratio=0.5', 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'model.backbone_weight_rank_ratio, line 10'),
    ('activation', 'maxmin', 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'model.act_name MinMax, line 6'),
    ('head', 'lln', 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'model.use_lln, line 4'),
    ('loss', 'la:eps=0.1411764705882353,gamma=5.0,temperature=0.75,offset=2.0', 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'loss.loss_type, eps, gamma, temperature, offset; lines 41-47'),
    ('dataset', 'cifar10', 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'dataset.name, line 34'),
    ('epochs', 800, 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'training.epochs, line 21'),
    ('batch_size', 256, 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'training.batch_size, line 20'),
    ('warmup_epochs', 20.0, 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'training.warmup_epochs, line 22'),
    ('lr', 0.001, 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'training.lr, line 23'),
    ('weight_decay', 4e-05, 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'training.weight_decay, line 24'),
    ('grad_clip', 3.0, 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'training.grad_clip, grad_clip_val; lines 25-26'),
    ('optimizer', 'nadam', 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'training.nadam, line 27'),
    ('lookahead', 6, 'bronet/configs/benchmark_reproduce/cifar10.yaml', 'training.lookahead, line 31'),
    ('schedule', 'cosine', 'bronet/tools/scheduler.py', '_cosine_get_lr, lines 29-32'),
    ('augment', True, 'bronet/tools/dataset/cifar.py', 'RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 8-9'),
]

BRONET_LIPCONVNET = [
    ('arch', 'lipconvnet-10:width=32', 'lipconvnet/main.py', '--block-size 2, --init-channels 32; lines 43-45'),
    ('conv', 'bro:rank_ratio=0.125', 'lipconvnet/main.py', '--conv-layer bro, --bro-rank; lines 40-41'),
    ('activation', 'maxmin', 'lipconvnet/main.py', '--activation, line 44'),
    ('head', 'lln', 'lipconvnet/trainer/trainer.py', 'LLN forced for CIFAR-100, lines 80-82'),
    ('loss', 'la:eps=0.0,gamma=5.0,temperature=0.75,offset=2.8284271247461903', 'lipconvnet/main.py', '--loss la, --temperature, --offset, --la_beta; lines 30-36'),
    ('dataset', 'cifar100', 'lipconvnet/main.py', '--dataset, line 53'),
    ('epochs', 200, 'lipconvnet/main.py', '--epochs, line 17'),
    ('batch_size', 512, 'lipconvnet/main.py', '--batch-size, line 16'),
    ('optimizer', 'sgd', 'lipconvnet/main.py', '--optimizer, line 28'),
    ('lr', 0.1, 'lipconvnet/main.py', '--lr-max, line 19'),
    ('momentum', 0.9, 'lipconvnet/main.py', '--momentum, line 21'),
    ('weight_decay', 0.0003, 'lipconvnet/main.py', '--weight-decay, line 20'),
    ('schedule', 'step', 'lipconvnet/utils/misc.py', 'MultiStepLR (lr-scheduler default), line 104'),
    ('lr_milestones', [0.5, 0.75], 'lipconvnet/utils/misc.py', 'lr_steps // 2, 3 * lr_steps // 4; line 104'),
    ('lr_gamma', 0.1, 'lipconvnet/utils/misc.py', 'gamma=0.1, line 104'),
    ('seed', 3407, 'lipconvnet/main.py', '--seed, line 59'),
    ('augment', True, 'lipconvnet/utils/data.py', 'RandomCrop(32, padding=4) + RandomHorizontalFlip, lines 292-293'),
]

TABLES = {"bronet": BRONET, "bronet-lipconvnet": BRONET_LIPCONVNET}
#: distributions besides lipcli-bro whose components the recipes name
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
