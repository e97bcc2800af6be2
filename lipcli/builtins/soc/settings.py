"""The SOC built-in's layout settings (memory format of the series; values unchanged up to
floating-point rounding).

The one environment variable of the series, ``LIPCLI_CUDA_CHANNELS_LAST``, is read here and
nowhere else, once, when the SOC built-in is first imported (i.e. when the plugin host loads
it).  To change a setting inside a running process assign the attribute of this module
(``lipcli.builtins.soc.settings.CUDA_CHANNELS_LAST = False``): the series reads these
attributes at every call (:func:`lipcli.builtins.soc.series.working_format`).
"""

from __future__ import annotations

import os

#: the environment variable that sets :data:`CUDA_CHANNELS_LAST` (``0``, ``false`` or ``no``: off)
CUDA_CHANNELS_LAST_ENV = "LIPCLI_CUDA_CHANNELS_LAST"
#: the environment variable that sets :data:`CPU_DENSE_SMALL_IMAGES` (``1``, ``true`` or ``yes``: on)
CPU_DENSE_SMALL_IMAGES_ENV = "LIPCLI_SOC_CPU_DENSE"


def _env_switch(name: str) -> bool:
    """An on-by-default switch: off when the variable is ``0``, ``false`` or ``no``."""
    return os.environ.get(name, "1").strip() not in ("0", "false", "no")


#: CPU inputs with at least this many pixels per channel run the series in channels-last
#: memory format (the oneDNN forward convolution is markedly faster there for few channels
#: and large images); ``None`` disables it.  Only a layout choice: values are unchanged
#: up to floating-point rounding, and both gradient modes use the same choice.
CHANNELS_LAST_MIN_PIXELS: int | None = 64

#: CUDA inputs run the series in channels-last memory format when ``True`` (cuDNN's float32/
#: TF32 convolutions otherwise convert every input and output between NCHW and NHWC).  A
#: layout choice only, as above.  Measured on an H200 (a one-off A/B, in the git history of
#: docs/benchmarks.md): convolution kernel time of a LipConvnet-20 step at batch 512 down
#: from 31.2 to 20.2 ms; training steps 13–17 % faster with ``soc-fast`` and 17–23 % with
#: ``soc`` at batch 512, 2–8 % at batch 128 (on a second H200 whose slower host set the pace:
#: ``soc-fast`` unchanged, ``soc`` 17 % faster at batch 512).  The environment variable
#: ``LIPCLI_CUDA_CHANNELS_LAST=0`` turns it off (:data:`CUDA_CHANNELS_LAST_ENV`, read once, here).
CUDA_CHANNELS_LAST: bool = _env_switch(CUDA_CHANNELS_LAST_ENV)

#: CPU series on images so small that every output pixel sees every input pixel through the
#: filter (``H, W ≤ k//2 + 1`` and ``H·W < k²``: 2×2 images under a 3×3 filter) run as matrix
#: products with the layer's dense ``(C·H·W)²`` matrix instead of convolutions (the same linear
#: map; fewer multiply-adds, since the convolution also multiplies the padding).  Off by
#: default: the values differ from the convolutions' by floating-point rounding only, so models
#: trained with it are not bit-identical to those trained without.  ``LIPCLI_SOC_CPU_DENSE=1``
#: turns it on (:data:`CPU_DENSE_SMALL_IMAGES_ENV`, read once, here).
CPU_DENSE_SMALL_IMAGES: bool = os.environ.get(CPU_DENSE_SMALL_IMAGES_ENV, "0").strip().lower() in ("1", "true", "yes")
