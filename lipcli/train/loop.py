"""The driver: :func:`train` (configure, build, run, checkpoint, resume, write the model file)."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import __version__
from ..errors import LipError, LipUsageError
from .checkpoint import (_prefixed, flatten_state, read_checkpoint, rng_state, set_rng_state,
                         unflatten_state, write_checkpoint)
from .config import (CHECKPOINT_FORMAT, CHECKPOINT_NAME, CHECKPOINT_VERSION, CRC_CERTIFICATE,
                     INTERRUPT_ENV, MODEL_NAME, TrainConfig)
from .distributed import DistContext
from .errors import TrainingDiverged, TrainingInterrupted
from .evaluation import evaluate, lipschitz_record
from .losses import CurvaturePenalty, FeatureAttack, TrainStep
from .optim import recipe_sgd, weight_decay_groups
from .paths import RunPaths, _check_writable_dir, plan_paths
from .reporting import Reporter


@dataclass
class _State:
    epoch: int = 0
    step: int = 0
    elapsed: float = 0.0
    images: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    resumed_from: list[int] = field(default_factory=list)


def _interrupt_point() -> tuple[int, int] | None:
    raw = os.environ.get(INTERRUPT_ENV, "").strip()
    if not raw:
        return None
    epoch, _, step = raw.partition(":")
    return int(epoch), int(step or 0)


def _component_names(cfg: TrainConfig) -> dict[str, str]:
    return {"arch": cfg.arch, "conv": cfg.conv, "activation": cfg.activation, "pool": cfg.pool,
            "head": cfg.head}


RESUME_CHANGEABLE = frozenset({"device", "workers", "data_dir"})
COMPONENT_SETTINGS = ("arch", "conv", "activation", "pool", "head", "dataset")


def _same_setting(key: str, stored: TrainConfig, given: Any, reg: Any) -> bool:
    """Whether ``given`` (a resume override) equals the stored value of setting ``key``."""
    try:
        value = getattr(stored.updated({key: given}, source="--resume"), key)
    except LipError:
        return False
    old = getattr(stored, key)
    if value == old:
        return True
    if key in COMPONENT_SETTINGS and isinstance(value, str) and isinstance(old, str):
        try:  # "mlp:hidden=32" and "mlp: hidden = 32" are the same choice
            a, b = reg.component(key, value), reg.component(key, old)
        except LipError:
            return False
        return a.name == b.name and a.params == b.params
    return False


def _arch_component(cfg: TrainConfig, reg: Any) -> Any:
    """The architecture with ``--width`` applied; the same width given twice (``--arch
    NAME:width=W`` and ``--width W``) is fine, two different widths are a usage error."""
    from ..plugins import parse_component_choice

    inline = parse_component_choice(cfg.arch)[1]
    if cfg.width is None:
        return reg.component("arch", cfg.arch)
    if "width" in inline:
        own = reg.component("arch", cfg.arch).params.get("width")
        if own != cfg.width:
            raise LipUsageError(
                f"conflicting widths: --arch {cfg.arch} sets width {own} but --width is "
                f"{cfg.width}; give the width once"
            )
    return reg.component("arch", cfg.arch, {"width": cfg.width})


def _component_error_message(exc: Any, cfg: TrainConfig) -> str:
    """The CLI wording of a :class:`~lipcli.models.ComponentParameterError`: the option that
    set the rejected value when that is ``--width``, else the component and its values."""
    width_only = cfg.width is not None and (
        (exc.kind == "arch" and set(exc.params) == {"width"})
        or (not exc.params and exc.context is not None and set(exc.context[2]) == {"width"})
    )
    if width_only:
        return f"--width {cfg.width}: {exc.reason}"
    return str(exc)


def train(
    config: TrainConfig | None = None,
    *,
    run_dir: str | None = None,
    out: str | None = None,
    resume: str | None = None,
    resume_overrides: dict[str, Any] | None = None,
    quiet: bool = False,
    registry: Any = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train (or resume) a model; returns the JSON summary.  See the :mod:`lipcli.train` docstring.

    For a new run pass ``config``; for ``resume`` (a run directory) the stored config is used
    and only ``resume_overrides`` in :data:`RESUME_CHANGEABLE` (and ``out``) may change it
    (an override equal to the stored value is accepted).  An existing model file or finished
    run directory is replaced only with ``overwrite`` (see :func:`plan_paths`).
    Every argument is validated before anything is written.
    """
    from ..data import check_data_dir, eval_loader, load_data, resolve_dataset, train_loader
    from ..models import ComponentParameterError, build_model, make_config
    from ..plugins import get_registry

    reg = registry or get_registry()
    ctx = DistContext.from_env()

    # ---- 1. configuration (no side effects) --------------------------------------------------
    ckpt_tensors: dict[str, torch.Tensor] | None = None
    ckpt_meta: dict[str, Any] | None = None
    if resume is not None:
        rd = Path(resume).expanduser()
        if not rd.is_dir():
            raise LipUsageError(f"--resume {rd}: not a directory")
        ckpt_tensors, ckpt_meta = read_checkpoint(rd / CHECKPOINT_NAME)
        cfg = TrainConfig().updated(ckpt_meta["config"], source=str(rd / CHECKPOINT_NAME))
        overrides = dict(resume_overrides or {})
        fixed = sorted(
            k for k in overrides if k not in RESUME_CHANGEABLE and not _same_setting(k, cfg, overrides[k], reg)
        )
        if fixed:
            raise LipUsageError(
                "--resume continues a run with its stored settings; cannot change "
                + ", ".join(f"--{k.replace('_', '-')} (stored: {getattr(cfg, k)!r})" for k in fixed)
            )
        cfg = cfg.updated({k: v for k, v in overrides.items() if k in RESUME_CHANGEABLE}, source="--resume")
        stored_out = ckpt_meta.get("out")
        new_out = out is not None and (
            not stored_out or Path(out).expanduser().absolute() != Path(stored_out).absolute()
        )
        out = out or stored_out
        if not os.access(rd, os.W_OK | os.X_OK):
            raise LipUsageError(f"run directory {rd} is not writable")
        paths = RunPaths(run_dir=rd, out=Path(out).expanduser() if out else rd / MODEL_NAME)
        if paths.out.is_dir():
            raise LipUsageError(f"--out {paths.out} is a directory; give a file name (e.g. model.safetensors)")
        if new_out and paths.out.exists() and not overwrite:
            raise LipUsageError(
                f"model file {paths.out} already exists; pass --overwrite to replace it or choose another --out"
            )
        _check_writable_dir(paths.out.parent, "output directory")
    else:
        cfg = config or TrainConfig()
        paths = None  # decided after validation, below
    cfg.validate()
    comps = {}
    for kind, choice in _component_names(cfg).items():
        comps[kind] = _arch_component(cfg, reg) if kind == "arch" else reg.component(kind, choice)
    data_comp = resolve_dataset(cfg.dataset, reg)
    crc = getattr(comps["head"].spec, "certificate", None) == CRC_CERTIFICATE
    cfg = cfg.resolved(dataset_name=data_comp.name, crc=crc)
    root = check_data_dir(data_comp, cfg.data_dir, cfg.download)
    device = ctx.resolve_device(cfg.device)
    if cfg.batch_size % ctx.world_size:
        raise LipUsageError(
            f"--batch-size {cfg.batch_size} is the global batch; it must be divisible by the "
            f"{ctx.world_size} processes"
        )
    if paths is None:
        paths = plan_paths(cfg, run_dir=run_dir, out=out, overwrite=overwrite)
    workers = cfg.workers if cfg.workers is not None else (
        0 if device.type == "cpu" else min(4, max(1, (os.cpu_count() or 2) // ctx.local_world_size - 1))
    )
    reporter = Reporter(enabled=ctx.is_main and not quiet)

    # ---- 2. data and model (still nothing written, except a requested download) -------------
    ctx.init(device)
    try:
        if ctx.distributed:  # one run directory for everyone (rank 0's timestamp)
            paths = RunPaths(*(Path(p) for p in ctx.broadcast_json([str(paths.run_dir), str(paths.out)])))
        if cfg.download and not ctx.is_main:
            ctx.barrier()  # rank 0 downloads first
        data = load_data(
            data_comp, root, download=cfg.download and ctx.is_main, augment=cfg.augment,
            val_split=cfg.val_split, limit_train=cfg.limit_train, limit_test=cfg.limit_test,
            seed=cfg.seed,
        )
        if cfg.download and ctx.is_main:
            ctx.barrier()
        if data.image_shape[1:] != (32, 32):
            raise LipUsageError(f"dataset {data_comp.name!r} yields {data.image_shape} images; need 32x32")
        model_config = make_config(
            comps["arch"].to_config(), conv=comps["conv"].to_config(),
            activation=comps["activation"].to_config(), pool=comps["pool"].to_config(),
            head=comps["head"].to_config(), num_classes=data.num_classes,
            in_channels=data.image_shape[0], image_size=data.image_shape[1:], mean=data.mean,
            std=data.std, registry=reg,
        )
        torch.manual_seed(cfg.seed)
        try:
            model = build_model(model_config, reg)
        except ComponentParameterError as exc:
            raise LipUsageError(_component_error_message(exc, cfg)) from exc
        model = model.to(device)
        return _run(cfg, ctx, device, paths, reporter, data, model, model_config, crc, workers,
                    ckpt_tensors, ckpt_meta, train_loader, eval_loader)
    finally:
        reporter.stop()
        ctx.destroy()


def _run(cfg, ctx, device, paths, reporter, data, model, model_config, crc, workers,
         ckpt_tensors, ckpt_meta, train_loader, eval_loader) -> dict[str, Any]:
    from ..models import save_model

    pin = device.type == "cuda"
    per_rank_batch = cfg.batch_size // ctx.world_size
    loader, sampler = train_loader(
        data.train, batch_size=per_rank_batch, seed=cfg.seed, rank=ctx.rank,
        world_size=ctx.world_size, workers=workers, pin_memory=pin,
    )
    val_loader = None if data.val is None else eval_loader(
        data.val, batch_size=cfg.eval_batch_size, rank=ctx.rank, world_size=ctx.world_size,
        workers=workers, pin_memory=pin)
    test_loader = eval_loader(
        data.test, batch_size=cfg.eval_batch_size, rank=ctx.rank, world_size=ctx.world_size,
        workers=workers, pin_memory=pin)
    steps_per_epoch = len(loader)
    total_steps = cfg.epochs * steps_per_epoch

    groups = weight_decay_groups(model, cfg.weight_decay)
    optimizer = recipe_sgd(groups, lr=cfg.lr, momentum=cfg.momentum)
    # as the reference: milestones [total // 2, 3 * total // 4] (a list: equal ones compound)
    milestones = [int(f * total_steps) for f in cfg.lr_milestones]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=cfg.lr_gamma)
    amp_dtype = torch.bfloat16
    if cfg.amp and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        amp_dtype = torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp and amp_dtype == torch.float16)

    attack = curvature = None
    if crc:
        min_std = min(data.std)
        attack = FeatureAttack(cfg.attack_radius / min_std, steps=cfg.attack_steps) if cfg.attack_radius else None
        if cfg.curvature_weight:
            feat_dim = CurvaturePenalty.head_weights(model.head)[0].shape[1]
            curvature = CurvaturePenalty(
                feat_dim, power_steps=cfg.curvature_power_steps, other_classes=cfg.curvature_classes,
                seed=cfg.seed,
            ).to(device)
            curvature.update_u(model.head, cfg.power_iter_steps)
    step_module = TrainStep(model, attack=attack, curvature=curvature,
                            curvature_weight=cfg.curvature_weight or 0.0)

    state = _State()
    if ckpt_tensors is not None:
        state = _restore(ckpt_tensors, ckpt_meta, model, optimizer, scheduler, scaler, curvature,
                         steps_per_epoch, data, model_config)
        state.resumed_from.append(state.epoch)

    def checkpoint(status: str = "running") -> None:
        if not ctx.is_main:
            return
        tensors: dict[str, torch.Tensor] = {}
        for k, v in model.state_dict().items():
            tensors[f"model.{k}"] = v.detach().cpu().clone().contiguous()
        meta = {
            "format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION,
            "lipcli_version": __version__, "status": status,
            "epoch": state.epoch, "step": state.step, "steps_per_epoch": steps_per_epoch,
            "elapsed_s": state.elapsed, "images": state.images,
            "config": cfg.to_json(), "model_config": model_config, "dataset": data.info(),
            "out": str(paths.out.absolute()), "world_size": ctx.world_size, "device": str(device),
            "history": state.history, "best": state.best, "resumed_from": state.resumed_from,
            "optimizer": flatten_state(optimizer.state_dict(), "optim", tensors),
            "scheduler": flatten_state(scheduler.state_dict(), "sched", tensors),
            "scaler": flatten_state(scaler.state_dict(), "scaler", tensors),
            "rng": flatten_state(rng_state(), "rng", tensors),
            "curvature": None if curvature is None else flatten_state(
                {k: v for k, v in curvature.state_dict().items()}, "curv", tensors),
        }
        write_checkpoint(paths.checkpoint, tensors, meta)

    # ---- 3. the run directory (first writes) --------------------------------------------------
    if ctx.is_main:
        try:
            paths.run_dir.mkdir(parents=True, exist_ok=True)
            paths.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LipError(f"cannot create {paths.run_dir}: {exc.strerror or exc}") from None
        if ckpt_tensors is None:
            for stale in (paths.log, paths.best):
                if stale.exists():
                    stale.unlink()
            from ..modelfile import atomic_write_bytes

            atomic_write_bytes(paths.config, (json.dumps(cfg.to_json(), indent=2) + "\n").encode())
            checkpoint()
    ctx.barrier()

    reporter.print(f"lip train: run directory {paths.run_dir} (model -> {paths.out})")
    if ckpt_tensors is not None:
        reporter.print(f"resuming after epoch {state.epoch} of {cfg.epochs}")
    reporter.print("resolved configuration: " + json.dumps(cfg.to_json(), sort_keys=False))
    reporter.print(
        f"data: {data.component.name} ({data.num_classes} classes; "
        + ", ".join(f"{k} {v}" for k, v in data.sizes.items())
        + f"); device {device}" + (f" x {ctx.world_size} processes ({ctx.backend})" if ctx.distributed else "")
        + f"; {sum(p.numel() for p in model.parameters()):,} parameters"
    )

    ddp_module: nn.Module = step_module
    if ctx.distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        import inspect

        # rank 0's buffers (SOC power-iteration vectors) are copied to all ranks at every forward
        sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
                else "broadcast_buffers")
        ddp_module = DDP(step_module, device_ids=[device.index] if device.type == "cuda" else None,
                         **{sync: True})
    params = [p for p in model.parameters() if p.requires_grad]
    interrupt_at = _interrupt_point()
    check_every = 1 if device.type == "cpu" else 25
    mid_step = steps_per_epoch // 2

    def refresh() -> None:
        refresher = getattr(model, "refresh_power_iteration", None)
        if callable(refresher):
            refresher(cfg.power_iter_steps)
        ctx.sync_module_state(model)

    reporter.start()
    current_epoch = state.epoch
    try:
        for epoch in range(state.epoch, cfg.epochs):
            current_epoch = epoch
            seed = _epoch_seed(cfg.seed, epoch, ctx.rank)
            torch.manual_seed(seed)
            loader.generator.manual_seed(seed)
            sampler.set_epoch(epoch)
            model.train()
            step_module.train()
            reporter.epoch(epoch + 1, cfg.epochs, steps_per_epoch)
            sums = torch.zeros(3, dtype=torch.float64, device=device)
            extra = torch.zeros(1, dtype=torch.float64, device=device)
            checked = torch.zeros(1, dtype=torch.float64, device=device)
            t0 = time.perf_counter()
            seen = 0
            for i, (images, labels) in enumerate(loader):
                if interrupt_at is not None and interrupt_at == (epoch, i):
                    raise KeyboardInterrupt
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=amp_dtype, enabled=cfg.amp):
                    loss, logits, parts = ddp_module(images, labels)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if cfg.grad_clip:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                state.step += 1
                n = labels.shape[0]
                seen += n
                sums[0] += loss.detach().double() * n
                sums[1] += (logits.argmax(dim=1) == labels).sum()
                sums[2] += n
                if "curvature" in parts:
                    extra[0] += parts["curvature"].double() * n
                if i == mid_step and steps_per_epoch > 1:
                    refresh()
                if (i + 1) % check_every == 0 or i + 1 == steps_per_epoch:
                    checked.copy_(sums[:1])
                    ctx.all_reduce_sum(checked)
                    if not math.isfinite(float(checked)):
                        raise TrainingDiverged(
                            f"loss became NaN/inf at epoch {epoch + 1}, step {i + 1} (lr "
                            f"{scheduler.get_last_lr()[0]:.3g}); kept the last good checkpoint "
                            f"{paths.checkpoint} (epoch {state.epoch}); try a lower --lr or "
                            "--grad-clip 1"
                        )
                    if reporter.progress is not None:
                        dt = max(time.perf_counter() - t0, 1e-9)
                        reporter.update(i + 1, float(sums[0] / sums[2]), float(sums[1] / sums[2]),
                                        seen * ctx.world_size / dt)
            refresh()  # end of epoch: before evaluation and before the checkpoint
            if curvature is not None:
                curvature.update_u(model.head, cfg.power_iter_steps)
                ctx.sync_module_state(curvature)
            train_time = time.perf_counter() - t0
            ctx.all_reduce_sum(sums)
            ctx.all_reduce_sum(extra)
            record: dict[str, Any] = {
                "epoch": epoch + 1,
                "train_loss": float(sums[0] / sums[2]),
                "train_accuracy": float(sums[1] / sums[2]),
                "lr": float(optimizer.param_groups[0]["lr"]),
                "time_s": round(train_time, 3),
                "images_per_s": round(float(sums[2]) / max(train_time, 1e-9), 1),
            }
            if curvature is not None:
                record["train_curvature"] = float(extra[0] / sums[2])
            if val_loader is not None:
                val = evaluate(model, val_loader, ctx)
                record["val_loss"], record["val_accuracy"] = val["loss"], val["accuracy"]
                if cfg.keep_best and (state.best is None or val["accuracy"] > state.best["val_accuracy"]):
                    state.best = {"epoch": epoch + 1, "val_accuracy": val["accuracy"]}
                    if ctx.is_main:
                        save_model(model, paths.best, dataset=data.info(),
                                   training={"epoch": epoch + 1, "val_accuracy": val["accuracy"]})
            state.epoch = epoch + 1
            state.elapsed += train_time
            state.images += int(sums[2])
            state.history.append(record)
            if ctx.is_main:
                with open(paths.log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
            checkpoint()
            ctx.barrier()
            reporter.print(
                f"epoch {epoch + 1}/{cfg.epochs}  loss {record['train_loss']:.4f}  "
                f"acc {record['train_accuracy']:.4f}"
                + (f"  val {record['val_accuracy']:.4f}" if "val_accuracy" in record else "")
                + f"  lr {record['lr']:.3g}  {record['images_per_s']:.0f} img/s  {train_time:.1f}s"
            )
    except KeyboardInterrupt:
        reporter.stop()
        command = (
            "lip train" if ctx.world_size == 1
            else f"torchrun --nproc-per-node {ctx.local_world_size} -m lipcli train"
        )
        interrupted = TrainingInterrupted(
            f"interrupted during epoch {current_epoch + 1}; the checkpoint after epoch "
            f"{state.epoch} is in {paths.run_dir}; resume with: {command} --resume {paths.run_dir}"
        )
        interrupted.silent = not ctx.is_main  # one message per run, from rank 0
        raise interrupted from None
    finally:
        reporter.stop()

    # ---- 4. final evaluation and the model file ---------------------------------------------
    ctx.check_consistent(model)
    if cfg.keep_best and state.best is not None:
        from ..modelfile import read_model_file

        model.load_state_dict(read_model_file(paths.best).tensors)
    model.eval()
    test = evaluate(model, test_loader, ctx)
    results: dict[str, Any] = {
        "test_accuracy": test["accuracy"], "test_loss": test["loss"], "test_examples": test["examples"],
        "selected_epoch": state.best["epoch"] if (cfg.keep_best and state.best) else state.epoch,
        "selection": "best validation accuracy" if (cfg.keep_best and state.best) else "last epoch",
    }
    last = state.history[-1] if state.history else {}
    for key in ("train_accuracy", "train_loss", "val_accuracy"):
        if key in last:
            results[f"{key}_last_epoch"] = last[key]
    summary: dict[str, Any] = {}
    if ctx.is_main:
        lipschitz = lipschitz_record(model, estimate=cfg.lipschitz_estimate)
        training = {
            "time_s": round(state.elapsed, 3),
            "epochs": state.epoch,
            "steps": state.step,
            "images_per_s": round(state.images / max(state.elapsed, 1e-9), 1),
            "config": cfg.to_json(),
            "seed": cfg.seed,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "world_size": ctx.world_size,
            "backend": ctx.backend,
            "workers": workers,
            "amp_dtype": str(amp_dtype).replace("torch.", "") if cfg.amp else None,
            "lipcli_version": __version__,
            "torch_version": torch.__version__,
            "weight_decay_parameters": groups[0]["names"],
            "run_dir": str(paths.run_dir),
            "resumed_from_epochs": state.resumed_from,
            "history": state.history,
        }
        save_model(model, paths.out, dataset=data.info(), lipschitz=lipschitz, results=results,
                   training=training)
        checkpoint(status="complete")
        summary = {
            "model": str(paths.out),
            "run_dir": str(paths.run_dir),
            "dataset": data.component.name,
            "epochs": state.epoch,
            "test_accuracy": test["accuracy"],
            "val_accuracy": last.get("val_accuracy"),
            "lipschitz_upper_bound": lipschitz.get("upper_bound"),
            "lipschitz_estimate": lipschitz.get("estimate"),
            "time_s": training["time_s"],
            "images_per_s": training["images_per_s"],
            "device": str(device),
            "world_size": ctx.world_size,
        }
        reporter.print(
            f"test accuracy {test['accuracy']:.4f} ({test['examples']} images); Lipschitz bound "
            f"{lipschitz.get('upper_bound')}; model written to {paths.out}"
        )
    ctx.barrier()
    return summary


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    from ..data import epoch_seed

    return epoch_seed(seed, epoch, rank)


def _restore(tensors, meta, model, optimizer, scheduler, scaler, curvature, steps_per_epoch,
             data, model_config) -> _State:
    """Load a checkpoint into the freshly built objects; check that it fits this run."""
    if meta.get("steps_per_epoch") != steps_per_epoch:
        raise LipUsageError(
            f"the checkpoint was made with {meta.get('steps_per_epoch')} steps per epoch but the "
            f"data now gives {steps_per_epoch}: the data set or the number of processes changed"
        )
    if meta.get("model_config", {}).get("num_classes") != model_config["num_classes"]:
        raise LipUsageError("the checkpoint's number of classes does not match the data")
    model_state = _prefixed(tensors, "model.")
    try:
        model.load_state_dict(model_state, strict=True)
    except RuntimeError as exc:
        raise LipError(f"checkpoint does not fit the model: {str(exc).splitlines()[0]}") from None
    optimizer.load_state_dict(unflatten_state(meta["optimizer"], tensors))
    scheduler.load_state_dict(unflatten_state(meta["scheduler"], tensors))
    scaler.load_state_dict(unflatten_state(meta["scaler"], tensors))
    if curvature is not None and meta.get("curvature"):
        curvature.load_state_dict(unflatten_state(meta["curvature"], tensors))
    set_rng_state(unflatten_state(meta["rng"], tensors))
    return _State(
        epoch=int(meta["epoch"]), step=int(meta["step"]), elapsed=float(meta.get("elapsed_s", 0.0)),
        images=int(meta.get("images", 0)), history=list(meta.get("history") or []),
        best=meta.get("best"), resumed_from=list(meta.get("resumed_from") or []),
    )
