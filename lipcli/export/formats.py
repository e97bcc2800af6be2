"""Export formats: how an :class:`~lipcli.export.program.ExportedProgram` is serialised, where
its metadata record goes, and how the target runtime loads it back.

=============  ================  ===============================  ==========================
format         runtime           file                             metadata record
=============  ================  ===============================  ==========================
``pt2``        torch alone       ``torch.export`` archive          extra file ``lipcli.json``
``torchscript`` torch alone      TorchScript archive (traced)      extra file ``lipcli.json``
``onnx``       onnxruntime       ONNX model (``torch.onnx``)       ``metadata_props["lipcli"]``
=============  ================  ===============================  ==========================

Every format takes one input, ``image`` (``float32 (N, C, H, W)``, any ``N``), and returns
``logits`` and, with a certificate, ``radius`` (see :mod:`lipcli.export.program`).  Loading
code for deployment (no lipcli needed) is in the docstrings of the format classes.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from lipcli.sdk.errors import LipError, LipUsageError, NamedSettings, literal

#: name of the metadata record (an extra file in the torch archives, a metadata key in ONNX)
METADATA_NAME = "lipcli.json"
METADATA_KEY = "lipcli"
#: batch size of the example input that shapes are traced with (dynamic batch: not 0 or 1)
EXAMPLE_BATCH = 2
ONNX_EXTRA_HINT = "pip install 'lipcli[onnx]'"

#: ``run(images float32 numpy (N, C, H, W)) -> (logits, radius or None)`` as numpy arrays
Runner = Callable[[np.ndarray], tuple[np.ndarray, "np.ndarray | None"]]


class ExportUsageError(NamedSettings, LipUsageError):
    """Bad input to :func:`lipcli.export.export_model` whose message names its arguments as
    ``{name}`` fields (``output``, ``format``, ``overwrite``): the library spells them as
    the Python names, a front end as its options (:mod:`lipcli.sdk.errors`)."""

    def __init__(self, template: str) -> None:
        super().__init__(self._init_template(template))


class MissingRuntimeError(LipError):
    """The optional packages a format needs are not installed (exit 1)."""


def _outputs(result: Any) -> tuple[np.ndarray, np.ndarray | None]:
    if isinstance(result, (tuple, list)):
        logits, radius = result
        return np.asarray(logits.detach().numpy() if torch.is_tensor(logits) else logits), np.asarray(
            radius.detach().numpy() if torch.is_tensor(radius) else radius)
    return np.asarray(result.detach().numpy() if torch.is_tensor(result) else result), None


def _torch_runner(module: Any) -> Runner:
    def run(images: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        with torch.no_grad():
            return _outputs(module(torch.from_numpy(images)))

    return run


class _TorchArchive:
    """A torch archive run by torch alone (``pt2``, ``torchscript``): the metadata record is
    its extra file :data:`METADATA_NAME`; subclasses write and read the archive."""

    def available(self) -> None:
        return None

    def serialise(self, program: torch.nn.Module, example: torch.Tensor, record: dict) -> bytes:
        buf = io.BytesIO()
        with torch.no_grad():
            self._write(program, example, buf, {METADATA_NAME: json.dumps(record, sort_keys=True)})
        return buf.getvalue()

    def load(self, path: Path) -> tuple[Runner, dict]:
        extra = {METADATA_NAME: ""}
        module = self._read(path, extra)
        return _torch_runner(module), json.loads(extra[METADATA_NAME])

    def _write(self, program: torch.nn.Module, example: torch.Tensor, buf: io.BytesIO,
               extra: dict[str, str]) -> None:
        raise NotImplementedError

    def _read(self, path: Path, extra: dict[str, str]) -> Any:
        """The archive's module; fills ``extra`` with the extra files' contents."""
        raise NotImplementedError


class Pt2Format(_TorchArchive):
    """``torch.export`` archive (``.pt2``). Deploy with torch alone::

        import json, torch
        extra = {"lipcli.json": ""}
        program = torch.export.load("model.pt2", extra_files=extra).module()
        logits, radius = program(images)      # images: float32 (N, C, H, W) in [0, 1]
        record = json.loads(extra["lipcli.json"])
    """

    name, suffix, runtime = "pt2", ".pt2", "torch (torch.export)"

    def _write(self, program: torch.nn.Module, example: torch.Tensor, buf: io.BytesIO,
               extra: dict[str, str]) -> None:
        dims = ({0: torch.export.Dim.DYNAMIC},)
        exported = torch.export.export(program, (example,), dynamic_shapes=dims, strict=False)
        torch.export.save(exported, buf, extra_files=extra)

    def _read(self, path: Path, extra: dict[str, str]) -> Any:
        with open(path, "rb") as fh:
            return torch.export.load(fh, extra_files=extra).module()


class TorchScriptFormat(_TorchArchive):
    """TorchScript archive (``.torchscript.pt``, traced). Deploy with torch alone::

        import json, torch
        extra = {"lipcli.json": ""}
        program = torch.jit.load("model.torchscript.pt", _extra_files=extra)
        logits, radius = program(images)
        record = json.loads(extra["lipcli.json"])
    """

    name, suffix, runtime = "torchscript", ".torchscript.pt", "torch (TorchScript)"

    def _write(self, program: torch.nn.Module, example: torch.Tensor, buf: io.BytesIO,
               extra: dict[str, str]) -> None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript's deprecation and tracer notes
            traced = torch.jit.trace(program, (example,), check_trace=False)
            torch.jit.save(traced, buf, _extra_files=extra)

    def _read(self, path: Path, extra: dict[str, str]) -> Any:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.jit.load(str(path), _extra_files=extra, map_location="cpu")


class OnnxFormat:
    """ONNX model (``.onnx``), written by ``torch.onnx`` (needs ``lipcli[onnx]``). Deploy with
    onnxruntime alone::

        import json, onnxruntime as ort
        session = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
        logits, radius = session.run(None, {"image": images})   # numpy float32 (N, C, H, W)
        meta = session.get_modelmeta().custom_metadata_map
        record = json.loads(meta["lipcli"])
    """

    name, suffix, runtime = "onnx", ".onnx", "onnxruntime"

    def available(self) -> None:
        missing = []
        for module in ("onnx", "onnxscript", "onnxruntime"):
            try:
                __import__(module)
            except ImportError:
                missing.append(module)
        if missing:
            raise MissingRuntimeError(
                f"the onnx format needs the optional packages {', '.join(missing)}, which are not "
                f"installed: {ONNX_EXTRA_HINT}"
            )

    def serialise(self, program: torch.nn.Module, example: torch.Tensor, record: dict) -> bytes:
        import contextlib
        import logging
        import warnings

        outputs = ["logits", "radius"] if getattr(program, "certificate", None) is not None else ["logits"]
        dims = ({0: torch.export.Dim.DYNAMIC},)
        quiet = io.StringIO()
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(quiet):
            warnings.simplefilter("ignore")
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            onnx_program = torch.onnx.export(
                program, (example,), dynamo=True, dynamic_shapes=dims, input_names=["image"],
                output_names=outputs, optimize=True, verbose=False,
            )
        proto = onnx_program.model_proto
        entry = proto.metadata_props.add()
        entry.key = METADATA_KEY
        entry.value = json.dumps(record, sort_keys=True)
        return proto.SerializeToString()

    def load(self, path: Path) -> tuple[Runner, dict]:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        meta = session.get_modelmeta().custom_metadata_map

        def run(images: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
            result = session.run(None, {"image": images})
            return (result[0], result[1]) if len(result) > 1 else (result[0], None)

        return run, json.loads(meta[METADATA_KEY])


FORMATS: dict[str, Any] = {f.name: f for f in (Pt2Format(), OnnxFormat(), TorchScriptFormat())}


def get_format(name: str) -> Any:
    """The format called ``name`` (``LipUsageError`` listing the valid ones otherwise)."""

    key = (name or "").strip().lower()
    if key not in FORMATS:
        raise LipUsageError(f"unknown export format {name!r}; valid formats: {', '.join(FORMATS)}")
    return FORMATS[key]


def format_for(name: str | None, output: str | Path | None) -> Any:
    """The format to write: ``name`` when given, else the one whose suffix ``output`` has,
    else ``pt2``.  A known suffix of another format than ``name`` is an :class:`ExportUsageError`
    (``-o model.onnx --format pt2`` would write a file that onnxruntime cannot read)."""
    by_suffix = None
    if output is not None:
        text = str(output).lower()
        # longest suffix first: ".torchscript.pt" before ".pt"
        for fmt in sorted(FORMATS.values(), key=lambda f: -len(f.suffix)):
            if text.endswith(fmt.suffix):
                by_suffix = fmt
                break
    if name is None:
        return by_suffix or FORMATS["pt2"]
    fmt = get_format(name)
    if by_suffix is not None and by_suffix is not fmt:
        raise ExportUsageError(
            f"{{output}} {literal(output)} has the suffix of format {by_suffix.name!r} but {{format}} "
            f"is {fmt.name!r}; use a {fmt.suffix} file name or {{format}} {by_suffix.name}"
        )
    return fmt
