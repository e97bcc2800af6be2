"""The audit "published rule vs proven bound" of docs/results.md over the ``lip import`` test
fixtures (checkpoints made by the authors' own code: tools/make_import_fixtures*.py).

Usage::

    .venv/bin/python tools/audit_import_fixtures.py > audit.json

Per fixture: the fixture is imported (``lipcli.importing.import_checkpoint``, its
``<case>.config.json`` as ``--config`` where present); on its fixed inputs (the recorded seed; certified fractions at ε = half the median positive radius of the source's rule)
the source's own rule (the importer's ``source_certificates``: the source's constant and
radii) and lipcli's (the GUARANTEED bound of the model file, the exact linear-head margin
``(f_y − f_j)/(‖w_y − w_j‖·L)`` over every class; CRC heads: not computed here); and a lower
bound of the exact Lipschitz constant of the features: the largest spectral norm of their
float64 Jacobian at those inputs.  The source's constant lies below the exact norm, proven,
where it is below that lower bound.  One JSON object per line (the raw report).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = [
    ("improved-l2", "tests/data/import/improved_l2_lln_d10_w2.pt"),
    ("improved-l2", "tests/data/import/improved_l2_lip1_ortho_d5_w2.pt"),
    ("improved-l2", "tests/data/import/improved_l2_cayley_lln_d5_w2.pt"),
    ("sll", "plugins/lipcli-sll/tests/data/sll_cifar10_c2_d1_w4.pth"),
    ("sll", "plugins/lipcli-sll/tests/data/sll_cifar10_c0_d2_w4.pth"),
    ("bronet-lipconvnet", "plugins/lipcli-bro/tests/data/bronet_lipconvnet_b2_w2_c10.pt"),
    ("bronet-lipconvnet", "plugins/lipcli-bro/tests/data/bronet_lipconvnet_soc_b2_w2_c10.pt"),
    ("bronet", "plugins/lipcli-bro/tests/data/bronet_d2_w4_c10.pt"),
    ("bronet", "plugins/lipcli-bro/tests/data/bronet_d2_w4_c10_plain.pt"),
    ("liresnet", "plugins/lipcli-liresnet/tests/data/liresnet_cifar10_d2_w4.pth"),
    ("liresnet", "plugins/lipcli-liresnet/tests/data/liresnet_cifar100_d3_w6.pth"),
    ("lot", "plugins/lipcli-lot/tests/data/lot_lipresnet_b3_w2_lln.pt"),
    ("lot", "plugins/lipcli-lot/tests/data/lot_lipconvnet_b2_w2_lln.pt"),
]


def _lipcli_radii(model, x: torch.Tensor, bound: float) -> torch.Tensor | None:
    head = model.head
    w = head.normalized_weight() if hasattr(head, "normalized_weight") else getattr(head, "weight", None)
    if w is None or w.dim() != 2:
        return None
    with torch.no_grad():
        w = w.detach().double()
        logits = model(x).double()
        pred = logits.argmax(1)
        dist = (w[pred][:, None, :] - w[None, :, :]).norm(dim=2)
        ratio = (logits.gather(1, pred[:, None]) - logits) / (dist.clamp_min(1e-300) * bound)
        ratio[torch.arange(len(pred)), pred] = torch.inf
        return ratio.min(1).values.clamp_min(0)


def audit(importer: str, path: Path, out: Path) -> dict:
    from lipcli.host.models import load_model
    from lipcli.host.plugins import get_registry
    from lipcli.importing import import_checkpoint

    record = json.loads(path.with_name(f"{path.stem}.logits.json").read_text())
    config = path.with_name(f"{path.stem}.config.json")
    report = import_checkpoint(path, importer, out, overwrite=True, config=config if config.is_file() else None)
    model, _mf = load_model(out)
    x = torch.rand(*record["inputs"], generator=torch.Generator().manual_seed(record["input_seed"]))
    src = get_registry().component("importer", importer).build().source_certificates(model, x)
    bound = float(report.lipschitz_upper_bound)
    ours = _lipcli_radii(model, x, bound)
    m64 = model.double()
    jac = 0.0
    for i in range(len(x)):
        xi = x[i:i + 1].double()
        j = torch.autograd.functional.jacobian(lambda t: m64.features(t)[0], xi).reshape(-1, xi.numel())
        jac = max(jac, float(torch.linalg.matrix_norm(j, ord=2)))
    src_r = src.radii.double()
    row = {"fixture": path.name, "importer": importer, "description": report.description,
           "source_constant": float(src.lipschitz), "source_label": src.label, "lipcli_bound": bound,
           "exact_norm_lower_bound": jac, "source_below_exact": float(src.lipschitz) < jac,
           "inputs": len(x), "source_radii": src_r.tolist(),
           "lipcli_radii": None if ours is None else ours.tolist()}
    if ours is not None:
        eps = 0.5 * float(src_r[src_r > 0].median()) if bool((src_r > 0).any()) else 0.0
        row["eps"] = eps
        row["source_certified"] = float((src_r > eps).double().mean() if src.strict else (src_r >= eps).double().mean())
        row["lipcli_certified"] = float((ours >= eps).double().mean())
        row["source_radius_above_lipcli"] = int((src_r > ours + 1e-12).sum())
    return row


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for importer, rel in FIXTURES:
            row = audit(importer, ROOT / rel, Path(tmp) / "m.safetensors")
            print(json.dumps(row), flush=True)
            print(f"{row['fixture']}: source {row['source_constant']:.6g}, lipcli {row['lipcli_bound']:.6g}, "
                  f"exact >= {row['exact_norm_lower_bound']:.6g}", file=sys.stderr)


if __name__ == "__main__":
    main()
