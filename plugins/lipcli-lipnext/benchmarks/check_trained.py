"""After training: every declared orthogonal matrix's defect ``‖XXᵀ − I‖₂`` (float64) against
the retraction tolerance, and the model's GUARANTEED bound against the float64 Jacobian norm of
its features at test inputs.  ``python check_trained.py MODEL.safetensors [N]`` prints JSON."""

from __future__ import annotations

import json
import sys

import torch
from torch.autograd.functional import jacobian

from lipcli.sdk.orthogonal import orthogonal_parameters, orthogonality_defect
from lipcli.testing import get_registry, guaranteed_upper_bound, load_model, read_model_metadata


def main(path: str, n: int = 8) -> dict:
    model, _ = load_model(path)
    meta = read_model_metadata(path)
    tol = meta["training"]["optimization"]["params"]["retract_tol"]
    defects = {p.name: orthogonality_defect(p.param) for p in orthogonal_parameters(model)}
    bound, _ = guaranteed_upper_bound(model)
    data = get_registry().component("dataset", "digits").build(None, "test")
    model = model.double().eval()
    norms = []
    for i in range(n):
        x = data[i * 37][0].unsqueeze(0).double()
        J = jacobian(lambda t: model.features(t), x).reshape(model.feature_dim, -1)
        norms.append(float(torch.linalg.matrix_norm(J, ord=2)))
    return {"model": path, "retract_tol": tol, "max_defect": max(defects.values()),
            "defects_within_tol": all(d <= tol for d in defects.values()), "matrices": len(defects),
            "guaranteed_bound": bound, "max_jacobian_norm_float64": max(norms),
            "bound_covers": bound >= max(norms), "inputs": n}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))))
