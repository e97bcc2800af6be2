"""Processes and devices: :class:`DistContext` (torchrun environment, process group, collectives)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lipcli._util.devices import resolve_device
from lipcli.sdk.errors import LipError
from lipcli.train.config import LAUNCHER_ENV
from lipcli.train.errors import TrainUsageError, literal


#: what torch's communication libraries say when another process of the job went away
_LOST_PEER = ("connection reset by peer", "connection closed by peer", "broken pipe",
              "connection refused", "[gloo", "nccl communicator was aborted")


def lost_connection(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a collective of a multi-process run, means that another
    process of the run stopped (a gloo/NCCL connection error)."""
    import torch.distributed as dist

    text = str(exc).lower()
    return isinstance(exc, getattr(dist, "DistError", ())) or any(s in text for s in _LOST_PEER)


#: the variables a launcher (torchrun, ``lip train --nproc-per-node``) sets for its workers
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def check_launch_env(env: Any) -> None:
    """Refuse, in one line, ``RANK``/``WORLD_SIZE`` & co. that are not integers, or that ask
    for a distributed job no launcher started (no ``TORCHELASTIC_RUN_ID``, no
    ``MASTER_ADDR``/``MASTER_PORT``): left over in a shell, they would hang or fail later."""
    values = {}
    for name in _LAUNCH_VARS:
        text = str(env.get(name, "")).strip()
        if text and not text.isdigit():
            raise TrainUsageError(f"the environment sets {name}={literal(text)}, not a non-negative integer "
                                  "(it is set by launchers such as torchrun; unset it)")
        values[name] = int(text) if text else None
    asks = (values["WORLD_SIZE"] or 1) > 1 or (values["RANK"] or 0) > 0
    launcher = "TORCHELASTIC_RUN_ID" in env or ("MASTER_ADDR" in env and "MASTER_PORT" in env)
    if asks and not launcher:
        shown = ", ".join(f"{n}={values[n]}" for n in ("RANK", "WORLD_SIZE") if values[n] is not None)
        raise TrainUsageError(f"the environment sets {shown} but no launcher started this process (no "
                              "TORCHELASTIC_RUN_ID or MASTER_ADDR/MASTER_PORT): unset them, or start the "
                              "run with torchrun or {nproc_per_node}")
    if values["WORLD_SIZE"] is not None and values["RANK"] is not None and values["RANK"] >= max(values["WORLD_SIZE"], 1):
        raise TrainUsageError(f"the environment sets RANK={values['RANK']}, not below WORLD_SIZE={values['WORLD_SIZE']}")


@dataclass
class DistContext:
    """This process's place in a (possibly single-process) run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    #: launched by torchrun (or with RANK/WORLD_SIZE > 1): use a process group and DDP
    distributed: bool = False
    backend: str | None = None
    #: what started this process of a multi-process run: "lipcli" (lipcli.train.launch) or
    #: None (torchrun, or one process)
    launcher: str | None = None
    initialized: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> "DistContext":
        """Read torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``.

        Distributed (process group + DDP) when ``WORLD_SIZE > 1`` or when torchrun launched
        the process (``TORCHELASTIC_RUN_ID`` set), even with one process; else one plain process.
        """
        env = os.environ
        check_launch_env(env)
        world = int(env.get("WORLD_SIZE", "1") or 1)
        launched = "TORCHELASTIC_RUN_ID" in env and "RANK" in env
        if world <= 1 and not launched:
            return cls()
        return cls(
            rank=int(os.environ.get("RANK", "0")),
            world_size=world,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
            distributed=True,
            launcher="lipcli" if os.environ.get(LAUNCHER_ENV) == "lipcli" else None,
        )

    def resolve_device(self, name: str) -> torch.device:
        """The ``device`` setting as :func:`lipcli._util.devices.resolve_device`, except that a bare ``cuda``
        (also ``auto`` on a GPU machine) is this process's GPU: its local rank under torchrun,
        else the current CUDA device."""
        dev = resolve_device(name)
        if dev.type == "cuda" and dev.index is None:
            index = self.local_rank if self.distributed else torch.cuda.current_device()
            if index >= torch.cuda.device_count():
                raise TrainUsageError(
                    f"{{device}} {literal(name)}: process {self.local_rank} of this machine has no GPU of its "
                    f"own (only {torch.cuda.device_count()} CUDA device(s) visible)"
                )
            dev = torch.device("cuda", index)
        return dev

    def init(self, device: torch.device) -> None:
        if self.launcher == "lipcli":  # stop when lip train --nproc-per-node's process dies
            from lipcli.train.launch import follow_launcher

            follow_launcher()
        self.device = device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not self.distributed:
            return
        import torch.distributed as dist

        self.backend = "nccl" if device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            kwargs: dict[str, Any] = {}
            if device.type == "cuda":
                kwargs["device_id"] = device
            dist.init_process_group(backend=self.backend, **kwargs)
        self.initialized = True

    def destroy(self) -> None:
        if self.initialized:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self.initialized = False

    def barrier(self) -> None:
        if self.initialized:
            import torch.distributed as dist

            if self.device.type == "cuda":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.initialized:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_(self, tensor: torch.Tensor) -> None:
        if self.initialized:
            import torch.distributed as dist

            dist.broadcast(tensor, src=0)

    def broadcast_json(self, obj: Any) -> Any:
        """Rank 0's JSON-serialisable ``obj`` on every rank (tensors, no pickle)."""
        if not self.initialized:
            return obj
        data = json.dumps(obj).encode() if self.is_main else b""
        length = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        self.broadcast_(length)
        buf = torch.zeros(int(length.item()), dtype=torch.uint8, device=self.device)
        if self.is_main:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device))
        self.broadcast_(buf)
        return json.loads(bytes(buf.cpu().tolist()).decode())

    def check_consistent(self, module: nn.Module) -> None:
        """Raise :class:`LipError` unless every rank holds bit-identical parameters and buffers.

        Compares per-tensor fingerprints (sums of the raw bit patterns) with MAX and MIN
        all-reduces: the weights rank 0 saves must be the weights every rank trained.
        """
        if not self.initialized:
            return
        import torch.distributed as dist

        prints = []
        for t in list(module.parameters()) + list(module.buffers()):
            raw = t.detach().contiguous().view(-1)
            if raw.is_floating_point():
                bits = raw.view(torch.int32) if raw.element_size() == 4 else raw.double().view(torch.int64)
            else:
                bits = raw
            b = bits.to(torch.int64)
            prints.extend([b.sum(), (b % 65521).sum()])
        local = torch.stack(prints)
        high, low = local.clone(), local.clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        if not torch.equal(high, low):
            raise LipError("processes ended with different weights or buffers (DDP out of sync)")

    def sync_module_state(self, module: nn.Module) -> None:
        """Copy rank 0's buffers (SOC power-iteration vectors, ...) to every rank."""
        if not self.initialized:
            return
        for buf in module.buffers():
            self.broadcast_(buf.data)
