"""The paper's CRC-Lip training settings (the ``crc-lip`` loss spec's ``recipe`` and
``grad_clip``), written once here without torch: read by :mod:`lipcli.builtins.crc.plugin`, whose
loss spec's parameter help (``lip plugins -v``, ``lip train --help``) shows them."""

from __future__ import annotations

from typing import Any

#: paper settings (ρ in input space, γ) per data set name; other data sets use "cifar10"'s
PAPER_CRC_SETTINGS: dict[str, tuple[float, float]] = {
    "cifar10": (36.0 / 255.0, 0.5),
    "cifar100": (0.2, 0.75),
}
#: the reference's gradient-norm clipping for CRC-Lip training
CRC_GRAD_CLIP = 1.0


def paper_recipe(dataset: str) -> dict[str, Any]:
    """The paper's ``radius`` and ``gamma`` for ``dataset`` (CIFAR-10's for unknown ones)."""
    rho, gamma = PAPER_CRC_SETTINGS.get(dataset, PAPER_CRC_SETTINGS["cifar10"])
    return {"radius": rho, "gamma": gamma}


def recipe_text(index: int) -> str:
    """The per-data-set defaults of setting ``index`` (0: radius, 1: gamma) for help texts:
    ``cifar10 36/255, cifar100 0.2, others 36/255``."""

    def number(value: float) -> str:
        short = f"{value:g}"
        return short if float(short) == value else f"{round(value * 255)}/255"

    parts = [f"{name} {number(values[index])}" for name, values in PAPER_CRC_SETTINGS.items()]
    return ", ".join(parts + [f"others {number(PAPER_CRC_SETTINGS['cifar10'][index])}"])
