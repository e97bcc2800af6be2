"""Write the digests of the model tensors after a short default training run (a reference).

Used to check that the paper's recipe still trains bit-identically after changes to the
trainer: run it with the code to compare against first on ``sys.path`` (e.g. an export of
commit 659d790, the release before losses/optimisers/extra data became options)::

    mkdir /tmp/ref && git archive 659d790 | tar -x -C /tmp/ref
    PYTHONPATH=/tmp/ref python tests/data/make_train_reference.py tests/data/train_reference_659d790.json

The runs (``RUNS``) use the digits data, seed 0 and ONE thread (multi-threaded MKL may
change summation order between runs); each digest is the SHA-256 of a tensor's raw bytes.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

#: name -> TrainConfig settings (everything else: the defaults of the code under test)
RUNS: dict[str, dict] = {
    "lln-default": {"dataset": "digits", "arch": "lipconvnet-5", "width": 8, "epochs": 2},
    "mlp-default": {"dataset": "digits", "arch": "lipconvnet-5", "width": 8, "epochs": 2,
                    "head": "mlp:hidden=64", "pool": "projection"},
}
THREADS = 1


def tensor_digests(path: str | Path) -> dict[str, str]:
    """SHA-256 of every tensor of a safetensors file (raw bytes, with dtype and shape)."""
    from safetensors.torch import load_file

    out = {}
    for key, value in sorted(load_file(str(path)).items()):
        data = value.contiguous().cpu().numpy().tobytes()
        head = f"{value.dtype}:{tuple(value.shape)}:".encode()
        out[key] = hashlib.sha256(head + data).hexdigest()
    return out


def train_digests(settings: dict, directory: Path) -> dict[str, str]:
    """Train one run with the lipcli on sys.path; the digests of its model file."""
    import torch

    from lipcli.train import TrainConfig, train

    torch.set_num_threads(THREADS)
    cfg = TrainConfig().updated({**settings, "device": "cpu"})
    out = directory / "model.safetensors"
    train(cfg, out=str(out), run_dir=str(directory / "run"), quiet=True)
    return tensor_digests(out)


def main(target: str) -> None:
    import lipcli
    import torch

    result = {"lipcli_source": str(Path(lipcli.__file__).parent), "torch_version": torch.__version__,
              "threads": THREADS, "runs": {}}
    for name, settings in RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            result["runs"][name] = {"settings": settings, "digests": train_digests(settings, Path(tmp))}
    Path(target).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
