"""``lip train``: the paper's training recipe end to end (see :mod:`lipcli.train`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from lipcli.train.config import DEFAULT_EXTRA_RATIO, OPTIMIZER_LR, SCHEDULES, TrainConfig
from lipcli.cli.common import cli_errors, print_json

_COMPONENT = "NAME or NAME:key=value,..."
#: the defaults the help texts quote (written once, in TrainConfig)
_D = TrainConfig()
_LRS = ", ".join(f"{name} {lr:g}" for name, lr in OPTIMIZER_LR.items())


@cli_errors
def train(
    arch: Optional[str] = typer.Option(
        None, "--arch", help=f"Architecture ({_COMPONENT}); default lipconvnet-5 (the CPU-friendly "
        "baseline; the paper's best CIFAR models are lipconvnet-10..40)."),
    conv: Optional[str] = typer.Option(None, "--conv", help=f"Convolution ({_COMPONENT}); default soc-fast."),
    activation: Optional[str] = typer.Option(None, "--activation", help="Activation; default maxmin."),
    pool: Optional[str] = typer.Option(None, "--pool", help="Pooling (max, projection, ...); default max."),
    head: Optional[str] = typer.Option(
        None, "--head", help=f"Head: lln (trained with ce) or mlp (trained with crc-lip: feature attack "
        f"+ curvature regulariser); default {_D.head}."),
    loss: Optional[str] = typer.Option(
        None, "--loss", help=f"Training loss ({_COMPONENT}): ce, crc-lip, cr, margin-offset or a "
        "plugin's; default: the head's (lln: ce, mlp: crc-lip). `lip plugins -v` lists parameters."),
    width: Optional[int] = typer.Option(None, "--width", help="Architecture width (channels after the stem; paper 32)."),
    dataset: Optional[str] = typer.Option(
        None, "--dataset", help="Data set: cifar10 (default), cifar100, imagefolder, digits, or a plugin's."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Data set root (cifar10: DIR/cifar-10-batches-py/...; imagefolder: DIR/train, DIR/test)."),
    download: Optional[bool] = typer.Option(None, "--download", help="Download the data set into --data-dir if missing."),
    extra_data: Optional[Path] = typer.Option(
        None, "--extra-data", help="Extra training images: an uncompressed .npz (or a directory) with "
        "'image' uint8 NxHxWxC and 'label'; memory-mapped, augmented like the data set."),
    extra_ratio: Optional[float] = typer.Option(
        None, "--extra-ratio", help=f"Fraction of each batch drawn from --extra-data (default {DEFAULT_EXTRA_RATIO:g})."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Model file to write (default RUN_DIR/model.safetensors)."),
    run_dir: Optional[Path] = typer.Option(
        None, "--run-dir", help="Run directory for checkpoint and logs (default: OUT's stem + '-run' "
        "beside --out, else runs/ARCH-HEAD-TIMESTAMP)."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Epochs (default 200)."),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", help="Global batch size, split over processes (default 128)."),
    optimizer: Optional[str] = typer.Option(
        None, "--optimizer", help=f"Optimiser: {', '.join(OPTIMIZER_LR)} (default {_D.optimizer}, the paper's)."),
    lr: Optional[float] = typer.Option(
        None, "--lr", help=f"Learning rate (default per optimiser: {_LRS})."),
    momentum: Optional[float] = typer.Option(None, "--momentum", help=f"SGD momentum (default {_D.momentum})."),
    lookahead: Optional[int] = typer.Option(
        None, "--lookahead", help=f"Wrap the optimiser in Lookahead, syncing every K steps (alpha "
        f"{_D.lookahead_alpha}); default {_D.lookahead} (off)."),
    schedule: Optional[str] = typer.Option(
        None, "--schedule", help=f"LR schedule per step: {' or '.join(SCHEDULES)} (default {_D.schedule}: "
        f"x{_D.lr_gamma:g} at {' and '.join(f'{m:.0%}' for m in _D.lr_milestones)} of training)."),
    warmup_epochs: Optional[float] = typer.Option(
        None, "--warmup-epochs", help=f"Linear LR warm-up over this many epochs (default {_D.warmup_epochs:g})."),
    weight_decay: Optional[float] = typer.Option(
        None, "--weight-decay", help="Weight decay on conv filters and the LLN weight (default 5e-4)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed (default 0)."),
    workers: Optional[int] = typer.Option(
        None, "--workers", help="Data loader worker processes (default: 0 on CPU, up to 4 on CUDA)."),
    device: Optional[str] = typer.Option(None, "--device", help="auto (default), cpu, cuda or cuda:N."),
    amp: Optional[bool] = typer.Option(None, "--amp", help="Mixed precision for training steps (bf16; evaluation stays fp32)."),
    cuda_graphs: Optional[str] = typer.Option(
        None, "--cuda-graphs", help="auto (default: on CUDA where the configuration allows), on or "
        "off: replay each training step from a CUDA graph (same values; fewer kernel launches)."),
    augment: Optional[bool] = typer.Option(
        None, "--augment/--no-augment", help="Random crop (+ flip) augmentation (default on)."),
    attack_radius: Optional[float] = typer.Option(
        None, "--attack-radius", help="Sets the loss parameter radius (crc-lip: input-space l2 radius "
        "rho of the feature attack; default cifar10 36/255, cifar100 0.2, others 36/255)."),
    curvature_weight: Optional[float] = typer.Option(
        None, "--curvature-weight", help="Sets the loss parameter gamma (crc-lip: curvature weight; "
        "default cifar10 0.5, cifar100 0.75, others 0.5)."),
    grad_clip: Optional[float] = typer.Option(
        None, "--grad-clip", help="Gradient-norm clipping (default: the loss's, 1.0 for crc-lip, off "
        "otherwise; 0 = off)."),
    val_split: Optional[float] = typer.Option(
        None, "--val-split", help="Hold out this fraction of the training set for validation (never the test set)."),
    keep_best: Optional[bool] = typer.Option(
        None, "--keep-best", help="Keep the weights of the best validation epoch (needs --val-split)."),
    limit_train: Optional[int] = typer.Option(None, "--limit-train", help="Train on a seeded random subset of N images."),
    limit_test: Optional[int] = typer.Option(None, "--limit-test", help="Test on a seeded random subset of N images."),
    lipschitz_estimate: Optional[bool] = typer.Option(
        None, "--lipschitz-estimate/--no-lipschitz-estimate",
        help="Also store the power-method estimate of Lip(g) (default on; the guaranteed bound is always stored)."),
    config: Optional[Path] = typer.Option(
        None, "--config", help="Settings file (.toml, .json, .yaml) with TrainConfig keys; options given here win."),
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="Continue the run in this run directory from its last checkpoint."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an existing model file (--out) and a finished run in the "
        "run directory (its log and checkpoint); without it lip train refuses to replace them."),
    json_out: bool = typer.Option(False, "--json", help="Final summary as JSON on stdout."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress output on stderr."),
) -> None:
    """Train a provably 1-Lipschitz network with the paper's recipe (resumable; torchrun for DDP).

    Writes a run directory (config.json, train_log.jsonl, checkpoint.safetensors) and the
    model file, whose metadata holds the config, data set, guaranteed Lipschitz bound,
    test accuracy and the training record.  Ctrl-C keeps the last epoch's checkpoint:
    continue with `lip train --resume RUN_DIR`.  Several processes:
    `torchrun --nproc-per-node N -m lipcli train ...`.
    """
    from lipcli.sdk.errors import LipUsageError
    from lipcli.train import TrainConfig, load_config_file
    from lipcli.train import train as run_training

    given: dict[str, Any] = {
        "arch": arch, "conv": conv, "activation": activation, "pool": pool, "head": head,
        "width": width, "dataset": dataset, "loss": loss,
        "data_dir": None if data_dir is None else str(data_dir), "download": download,
        "extra_data": None if extra_data is None else str(extra_data), "extra_ratio": extra_ratio,
        "epochs": epochs, "batch_size": batch_size, "optimizer": optimizer, "lr": lr,
        "momentum": momentum, "lookahead": lookahead, "schedule": schedule,
        "warmup_epochs": warmup_epochs,
        "weight_decay": weight_decay, "seed": seed, "workers": workers, "device": device,
        "amp": amp, "cuda_graphs": None if cuda_graphs is None else cuda_graphs.strip().lower(),
        "augment": augment, "attack_radius": attack_radius,
        "curvature_weight": curvature_weight, "grad_clip": grad_clip, "val_split": val_split,
        "keep_best": keep_best, "lipschitz_estimate": lipschitz_estimate, "limit_train": limit_train, "limit_test": limit_test,
    }
    given = {k: v for k, v in given.items() if v is not None}
    out_s = None if out is None else str(out)
    if resume is not None:
        if config is not None:
            raise LipUsageError("--resume uses the run's stored settings; drop --config")
        if run_dir is not None:
            raise LipUsageError("--resume RUN_DIR already names the run directory; drop --run-dir")
        summary = run_training(resume=str(resume), resume_overrides=given, out=out_s, quiet=quiet,
                               overwrite=overwrite)
    else:
        cfg = TrainConfig()
        if config is not None:
            cfg = _without_file_width(
                cfg.updated(load_config_file(config), source=str(config)), given
            )
        cfg = cfg.updated(given, source="command line")
        summary = run_training(
            cfg, run_dir=None if run_dir is None else str(run_dir), out=out_s, quiet=quiet,
            overwrite=overwrite,
        )
    if json_out and summary:
        print_json(summary)


def _without_file_width(cfg, given: dict):
    """The command line wins over a settings file, the width included: a width given on the
    command line (``--width W`` or ``--arch NAME:width=W``) replaces the file's width in
    either form (its ``width`` key and an inline ``width=`` in its ``arch``)."""
    import dataclasses

    from lipcli.host.plugins import parse_component_choice

    arch_given = given.get("arch")
    if "width" not in given and not (
        isinstance(arch_given, str) and "width" in parse_component_choice(arch_given)[1]
    ):
        return cfg
    name, params = parse_component_choice(cfg.arch)
    if "width" in params:
        del params["width"]
        arch = name + (":" + ",".join(f"{k}={v}" for k, v in params.items()) if params else "")
        cfg = dataclasses.replace(cfg, arch=arch)
    return dataclasses.replace(cfg, width=None)
