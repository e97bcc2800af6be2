"""``lip import --verify INPUTS_AND_LOGITS.npz``: the imported model against the source's own
logits on the user's inputs, before the model file is written.

The ``.npz`` (``numpy.savez``, no pickles) holds ``inputs`` ``(N, C, H, W)`` — images as the
source's model takes them (in ``[0, 1]``, before its own normalisation) — and ``logits``
``(N, K)``, what the source's code in evaluation mode returned for them.  The imported model
(float32, as written) runs on the same inputs; the import is refused (one line, exit 1, no
file) when ``max |Δ| > tolerance · max(1, max |logits|)``.
"""

from __future__ import annotations

import io
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lipcli.sdk.errors import LipError, LipUsageError

__all__ = ["DEFAULT_VERIFY_TOLERANCE", "VerifyReport", "verify_logits"]

#: the default largest difference, relative to the larger of 1 and the largest |logit|
DEFAULT_VERIFY_TOLERANCE = 1e-4
#: a verify file larger than this is refused
MAX_VERIFY_BYTES = 1 << 30
#: inputs per forward batch
_BATCH = 256


@dataclass
class VerifyReport:
    """What ``--verify`` compared: points, classes, the largest difference and its scale."""

    file: str
    points: int
    max_abs_error: float
    scale: float
    tolerance: float
    same_predictions: int

    @property
    def relative_error(self) -> float:
        return self.max_abs_error / self.scale

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "relative_error": self.relative_error}


def _read(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    import numpy as np

    if not path.is_file():
        raise LipUsageError(f"--verify {path}: no such file")
    if path.stat().st_size > MAX_VERIFY_BYTES:
        raise LipUsageError(f"--verify {path}: larger than {MAX_VERIFY_BYTES} bytes")
    try:
        with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as npz:
            missing = [k for k in ("inputs", "logits") if k not in npz.files]
            if missing:
                raise LipUsageError(f"--verify {path}: no array {missing[0]!r} (it needs 'inputs' and 'logits')")
            inputs, logits = np.array(npz["inputs"]), np.array(npz["logits"])
    except LipUsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - a pickled array, a corrupt archive
        raise LipUsageError(f"--verify {path}: not a plain .npz of arrays ({exc})") from None
    if inputs.dtype.kind != "f" or logits.dtype.kind != "f":
        raise LipUsageError(f"--verify {path}: 'inputs' and 'logits' must be floating-point arrays")
    if inputs.ndim != 4 or logits.ndim != 2 or inputs.shape[0] != logits.shape[0] or not inputs.shape[0]:
        raise LipUsageError(f"--verify {path}: expected inputs (N, C, H, W) and logits (N, K) with the same N >= 1, "
                            f"got {tuple(inputs.shape)} and {tuple(logits.shape)}")
    return torch.from_numpy(inputs).float(), torch.from_numpy(logits).double()


def verify_logits(model: nn.Module, path: str | os.PathLike, tolerance: float = DEFAULT_VERIFY_TOLERANCE) -> VerifyReport:
    """Compare ``model`` with the source's logits in ``path`` (see the module); ``LipError``
    beyond ``tolerance``."""
    if not tolerance > 0:
        raise LipUsageError(f"--verify-tolerance {tolerance}: must be positive")
    path = Path(path)
    inputs, want = _read(path)
    shape = tuple(getattr(model, "lipcli_config", {}).get("image_size", ()) or ())
    channels = getattr(model, "lipcli_config", {}).get("in_channels")
    if (channels is not None and inputs.shape[1] != channels) or (shape and tuple(inputs.shape[2:]) != tuple(shape)):
        raise LipUsageError(f"--verify {path}: inputs of shape {tuple(inputs.shape[1:])}, the model takes "
                            f"({channels}, {', '.join(str(s) for s in shape)})")
    model.eval()
    with torch.no_grad():
        got = torch.cat([model(inputs[i:i + _BATCH]) for i in range(0, len(inputs), _BATCH)]).double()
    if got.shape != want.shape:
        raise LipUsageError(f"--verify {path}: logits of shape {tuple(want.shape)}, the model gives {tuple(got.shape)}")
    if not bool(torch.isfinite(want).all()):
        raise LipUsageError(f"--verify {path}: the source's logits contain NaN or infinite values")
    err = float((got - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    report = VerifyReport(file=str(path), points=len(inputs), max_abs_error=err, scale=scale, tolerance=tolerance,
                          same_predictions=int((got.argmax(1) == want.argmax(1)).sum()))
    if not err <= tolerance * scale:
        raise LipError(f"--verify {path.name}: the imported model's logits differ from the source's by up to "
                       f"{err:.3g} ({err / scale:.3g} of max(1, |logit|)), beyond the tolerance {tolerance:g}; "
                       f"{report.same_predictions} of {len(inputs)} predictions agree: model file not written")
    return report
