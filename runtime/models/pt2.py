"""torch.export programs (``model.format: pt2``) on the torch engine.

``model.source`` is a ``.pt2`` file, or a directory holding ``model.pt2`` (or exactly one ``.pt2``
file; hidden files are skipped). A ``.pt2`` file is a PT2 archive holding either or both of:

- an ``ExportedProgram`` (``torch.export.save``): its inputs and outputs are read from the program;
  it runs as ``ExportedProgram.module()`` (the graph's ATen operators, eagerly);
- an AOTInductor package (``torch._inductor.aoti_compile_and_package``, or
  ``torch.export.pt2_archive._package.package_pt2`` with ``aoti_files``): compiled kernels loaded by
  ``torch._inductor.aoti_load_package`` for the device they were compiled for. With the program in
  the same archive the tensors are read from the program; an AOTInductor package alone carries no
  datatypes or shapes, so ``model.inputs`` and ``model.outputs`` must declare them (their count, and
  the output names of a dict, are checked against the package's call spec).

Tensors read from a program: one per user input, in the order of ``forward``'s arguments (each
argument must be one tensor; its name is the argument's name, a keyword argument's its keyword), and
one per output: a dict of tensors names them by key; a tensor, a tuple or a list of tensors gives
``output_0``, ``output_1``, ... Datatypes are the fake tensors' dtypes; a dimension the program
leaves dynamic (a symbol in its range constraints) is -1. The first dimension of every input and
output must be dynamic: it is the batch, along which requests are stacked; an input's batch range
must admit one row and ``batching.max_batch_size`` rows (``torch.export.Dim("batch", min=1)``, or no
bounds). ``model.inputs`` / ``model.outputs``, when given, refine these (``tensors.refine``).

Quantization: ``none`` only (a program quantized before export is served as it is).
"""

from __future__ import annotations

import logging
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from kubeinfer.runtime.config import RuntimeConfig, TensorConfig
from kubeinfer.runtime.dtypes import DATATYPES
from kubeinfer.runtime.models.base import REPORT_LOAD_SECONDS, QuantizationError
from kubeinfer.runtime.models.device import configure_torch, resolve_device
from kubeinfer.runtime.models.tensors import model_tensor, refine
from kubeinfer.runtime.models.torchscript import TorchScriptModel
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

log = logging.getLogger(__name__)

#: The name errors give the format.
KIND = "pt2"
#: Archive entries (below the archive's top folder) of an ExportedProgram and of AOTInductor files.
PROGRAM_ENTRY = "models/model.json"
AOTI_PREFIX = "data/aotinductor/model/"


def model_file(source: str) -> Path:
    """The ``.pt2`` file ``source`` names: the file itself, or a directory's ``model.pt2``, else its one
    ``.pt2`` file (hidden files, such as the fetch step's report and temporary files, are skipped).

    Raises:
        FileNotFoundError: nothing there, or a directory without ``model.pt2`` and not exactly one
            ``.pt2`` file.
    """
    path = Path(source)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"model.source {source}: no such pt2 file or directory")
    if (path / "model.pt2").is_file():
        return path / "model.pt2"
    found = sorted(p for p in path.glob("*.pt2") if p.is_file() and not p.name.startswith("."))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise FileNotFoundError(
            f"model.source {source}: expected model.pt2 or exactly one .pt2 file, found {names}"
        )
    return found[0]


@dataclass(frozen=True)
class Archive:
    """What a ``.pt2`` archive holds: an ExportedProgram, AOTInductor files, or both."""

    program: bool
    aoti: bool


def archive_contents(path: Path) -> Archive:
    """Read the entries of the PT2 archive at ``path`` (a zip file whose entries sit in one top folder).

    Raises:
        ValueError: not a zip file, or one with neither an ExportedProgram nor AOTInductor files.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = {n.split("/", 1)[1] for n in archive.namelist() if "/" in n}
    except zipfile.BadZipFile as exc:
        raise ValueError(
            f"model.source {path}: not a .pt2 archive ({exc}); save the program with torch.export.save"
        ) from exc
    contents = Archive(program=PROGRAM_ENTRY in names, aoti=any(n.startswith(AOTI_PREFIX) for n in names))
    if not contents.program and not contents.aoti:
        raise ValueError(
            f"model.source {path}: a zip file with neither an ExportedProgram ({PROGRAM_ENTRY}) nor an "
            f"AOTInductor package ({AOTI_PREFIX}); save the program with torch.export.save"
        )
    return contents


#: Protocol datatype of each torch dtype a model may declare (``torch.int32`` -> ``INT32``).
TORCH_TO_DATATYPE: dict[torch.dtype, str] = {
    getattr(torch, info.torch): name for name, info in DATATYPES.items() if info.torch and info.declarable
}


@dataclass(frozen=True)
class Signature:
    """The tensors a program takes and gives, and how it is called.

    Attributes:
        inputs / outputs: the program's tensors, in call and return order.
        keywords: how many of the last inputs are passed as keyword arguments (by name).
        batch_ranges: per input, the smallest and largest batch (rows) the program admits (None: no
            upper bound).
    """

    inputs: list[TensorConfig]
    outputs: list[TensorConfig]
    keywords: int
    batch_ranges: dict[str, tuple[int, int | None]]


def _dims(value: Any) -> list[int | None]:
    """A fake tensor's dimensions: an int where fixed, None where symbolic."""
    return [d if isinstance(d, int) else None for d in value.shape]


def _value(nodes: dict[str, Any], arg: Any) -> Any:
    """A graph-signature argument's value: a tensor argument's fake tensor, else the argument itself
    (a constant or a symbolic int, which ``_datatype`` refuses)."""
    if isinstance(arg, TensorArgument):
        return nodes[arg.name].meta.get("val")
    return arg


def _bound(value: Any) -> int | None:
    """A range constraint's bound as an int; None where it is infinite (sympy's ``int_oo``)."""
    return int(value) if getattr(value, "is_Integer", False) else None


def _datatype(what: str, name: str, value: Any) -> str:
    if not isinstance(value, torch.Tensor):
        raise ValueError(
            f"{KIND} {what} '{name}': a {type(value).__name__}, not a tensor, is not served; export "
            "with tensor inputs and outputs only"
        )
    datatype = TORCH_TO_DATATYPE.get(value.dtype)
    if datatype is None:
        raise ValueError(f"{KIND} {what} '{name}': dtype {value.dtype} is not served")
    return datatype


def _leaf_names(spec: Any, what: str, names: list[str]) -> None:
    """Check that every child of ``spec`` is one value (a leaf): ``names`` names them, in order."""
    for name, child in zip(names, spec.children(), strict=True):
        if not child.is_leaf():
            raise ValueError(
                f"{KIND} {what} '{name}' is a {getattr(child.type, '__name__', child.type)} of "
                f"{child.num_leaves} values; every {what} must be one tensor"
            )


def output_names(out_spec: Any) -> list[str]:
    """Names of a program's outputs from its output tree spec: a dict's keys, else ``output_<i>``.

    Raises:
        ValueError: a nested output (a tuple inside the tuple, a dict of lists), or a dict key that is
            not a string.
    """
    if out_spec.is_leaf():
        return ["output_0"]
    if out_spec.type is dict:
        names = list(out_spec.context)
        if not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"{KIND} outputs: dict keys {names} must be non-empty strings")
    else:
        names = [f"output_{i}" for i in range(out_spec.num_children)]
    _leaf_names(out_spec, "output", names)
    return [str(n) for n in names]


def program_signature(program: torch.export.ExportedProgram) -> Signature:
    """The tensors of ``program`` (see the module docstring) and how to call it.

    Raises:
        ValueError: an input or output that is not one tensor, a dtype the protocol cannot carry, or a
            fixed first dimension, naming the tensor.
    """
    args_spec, kwargs_spec = program.call_spec.in_spec.children()
    arg_names = list(program.module_call_graph[0].signature.forward_arg_names or [])
    user_inputs = list(program.graph_signature.user_inputs)
    positional = args_spec.num_children
    if len(arg_names) < positional:  # no names recorded: the placeholders'
        arg_names = [str(n) for n in user_inputs[:positional]]
    names = [*arg_names[:positional], *[str(k) for k in kwargs_spec.context]]
    _leaf_names(args_spec, "input", names[:positional])
    _leaf_names(kwargs_spec, "input", names[positional:])
    nodes = {node.name: node for node in program.graph.nodes}
    specs = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    if len(specs) != len(names):
        raise ValueError(f"{KIND} inputs {names}: the program has {len(specs)} user inputs")
    inputs: list[TensorConfig] = []
    batch_ranges: dict[str, tuple[int, int | None]] = {}
    for name, spec in zip(names, specs, strict=True):
        value = _value(nodes, spec.arg)
        datatype = _datatype("input", name, value)
        inputs.append(model_tensor(KIND, "input", name, datatype, _dims(value), list(value.shape)))
        bounds = program.range_constraints.get(value.shape[0].node.expr)
        if bounds is None:  # an expression of symbols (not one symbol): no range of its own
            batch_ranges[name] = (0, None)
        else:
            batch_ranges[name] = (_bound(bounds.lower) or 0, _bound(bounds.upper))
    names = output_names(program.call_spec.out_spec)
    specs = [s for s in program.graph_signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    if len(specs) != len(names):
        raise ValueError(f"{KIND} outputs {names}: the program has {len(specs)} user outputs")
    outputs: list[TensorConfig] = []
    for name, spec in zip(names, specs, strict=True):
        value = _value(nodes, spec.arg)
        datatype = _datatype("output", name, value)
        outputs.append(model_tensor(KIND, "output", name, datatype, _dims(value), list(value.shape)))
    return Signature(inputs, outputs, keywords=kwargs_spec.num_children, batch_ranges=batch_ranges)


def check_batch_ranges(signature: Signature, max_batch_size: int) -> None:
    """Refuse a program whose batch range does not admit 1 to ``max_batch_size`` rows.

    Raises:
        ValueError: naming the input, its range and what to export instead.
    """
    for name, (lower, upper) in signature.batch_ranges.items():
        if lower > 1 or (upper is not None and upper < max_batch_size):
            shown = f"[{lower}, {'inf' if upper is None else upper}]"
            raise ValueError(
                f"{KIND} input '{name}': the program admits batches of {shown} rows; the runtime sends "
                f"1 to batching.max_batch_size ({max_batch_size}): export with "
                f'torch.export.Dim("batch", min=1) and no smaller max'
            )


class Pt2Model(TorchScriptModel):
    """A torch.export program (or its AOTInductor package) served with the tensors it declares.

    ``module`` is ``ExportedProgram.module()`` or the ``AOTICompiledModel``; both take the inputs as
    ``forward`` did (the last ``keywords`` by name) and return the outputs' tree (``execute`` reads
    a dict by output name, a tuple or list in order). Preprocessing, output checks and warmup are
    ``TorchScriptModel``'s and ``TensorModel``'s (every batch bucket up to the maximum).
    """

    def __init__(self, *, keywords: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.keywords = keywords
        self.compute_dtype = None  # inputs keep their declared datatype

    def call(self, tensors: list[torch.Tensor]) -> Any:
        """The program on one tensor per input: positional first, the last ``keywords`` by name."""
        split = len(tensors) - self.keywords
        named = {spec.name: t for spec, t in zip(self.inputs[split:], tensors[split:], strict=True)}
        return self.module(*tensors[:split], **named)


def _in_order(program: list[TensorConfig], refined: list[TensorConfig]) -> list[TensorConfig]:
    """``refined`` in the program's order: inputs are passed, and tuple outputs read, by position."""
    position = {t.name: i for i, t in enumerate(program)}
    return sorted(refined, key=lambda t: position[t.name])


def _declared_for_aoti(cfg: RuntimeConfig, runner: Any, path: Path) -> Signature:
    """The tensors of an AOTInductor package without its program: ``model.inputs/outputs``, checked
    against the package's call spec (input count, keyword names; output names of a dict, else the count).

    Raises:
        ValueError: nothing declared, or a declaration the call spec contradicts.
    """
    from torch.utils import _pytree as pytree

    if not cfg.model.inputs or not cfg.model.outputs:
        raise ValueError(
            f"model.inputs and model.outputs: {path} is an AOTInductor package without its "
            "ExportedProgram, which carries no datatypes or shapes: declare them, or package the "
            "program with it (package_pt2(exported_programs=..., aoti_files=...))"
        )
    in_spec, out_spec = (pytree.treespec_loads(s) for s in runner.loader.get_call_spec())
    if in_spec.num_leaves != len(cfg.model.inputs):
        raise ValueError(
            f"model.inputs: {len(cfg.model.inputs)} declared, the AOTInductor package takes "
            f"{in_spec.num_leaves}"
        )
    keywords = in_spec.children()[1].num_children if in_spec.num_children == 2 else 0
    by_keyword = [t.name for t in cfg.model.inputs[len(cfg.model.inputs) - keywords :]]
    if keywords and sorted(by_keyword) != sorted(str(k) for k in in_spec.children()[1].context):
        raise ValueError(
            f"model.inputs: the last {keywords} ({by_keyword}) are passed by keyword; the AOTInductor "
            f"package's keywords are {sorted(str(k) for k in in_spec.children()[1].context)}"
        )
    names = output_names(out_spec)
    declared = [t.name for t in cfg.model.outputs]
    if out_spec.type is dict and sorted(names) != sorted(declared):
        raise ValueError(
            f"model.outputs names {sorted(declared)}, the AOTInductor package has {sorted(names)}"
        )
    if len(names) != len(declared):
        raise ValueError(
            f"model.outputs: {len(declared)} declared, the AOTInductor package returns {len(names)}"
        )
    for spec in (*cfg.model.inputs, *cfg.model.outputs):
        if spec.datatype == "BYTES" or spec.shape[0] != -1:
            raise ValueError(f"model tensor '{spec.name}': a pt2 tensor is numeric with the batch (-1) first")
    return Signature(list(cfg.model.inputs), list(cfg.model.outputs), keywords, batch_ranges={})


def _load_aoti(path: Path, device: torch.device, runners: int) -> Any:
    """``aoti_load_package`` on ``device`` with ``runners`` model runners (the config's ``instances``, one
    per executor thread: a call waits for a free one), after checking the package was compiled for the
    device's type.

    Raises:
        ValueError: a package compiled for another device type; the loader's own error, as one line.
    """
    from torch._inductor import aoti_load_package

    try:
        runner = aoti_load_package(
            str(path), device_index=device.index if device.index is not None else -1, num_runners=runners
        )
    except Exception as exc:
        raise ValueError(f"model.source {path}: the AOTInductor package does not load here: {exc}") from exc
    compiled_for = runner.get_metadata().get("AOTI_DEVICE_KEY", "cpu")
    if compiled_for.split(":")[0] != device.type:
        raise ValueError(
            f"model.source {path}: the AOTInductor package was compiled for {compiled_for}, the runtime's "
            f"device is {device}: compile it for {device.type} or set device {compiled_for}"
        )
    return runner


def load_pt2(cfg: RuntimeConfig) -> Pt2Model:
    """Load the ``.pt2`` archive ``cfg.model.source`` names onto the resolved device (see the module
    docstring): its ExportedProgram, or its AOTInductor package where it holds one.

    Raises:
        FileNotFoundError: no model file there.
        QuantizationError: a quantization mode other than ``none``.
        ValueError: not a PT2 archive; a tensor that cannot be served, a batch range that cannot hold
            the batches, or an override that does not fit, naming the tensor; an AOTInductor package
            for another device, or without declared tensors where it has no program.
    """
    started = time.perf_counter()
    if cfg.quantization.mode != "none":
        raise QuantizationError(
            f"quantization '{cfg.quantization.mode}' is not supported for pt2 models; quantize before "
            "export, or use 'none'"
        )
    path = model_file(cfg.model.source)
    contents = archive_contents(path)
    device = resolve_device(cfg.device)
    configure_torch(device)
    program = torch.export.load(str(path)) if contents.program else None
    signature = program_signature(program) if program is not None else None
    module: Callable[..., Any]
    if contents.aoti:
        module = _load_aoti(path, device, cfg.instances)
        engine = "AOTInductor"
        if signature is None:
            signature = _declared_for_aoti(cfg, module, path)
    else:
        assert program is not None
        if device.type != "cpu":
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, device)
        module = program.module()
        engine = "ExportedProgram"
    assert signature is not None
    check_batch_ranges(signature, cfg.batching.max_batch_size)
    if program is not None:
        inputs = _in_order(signature.inputs, refine(signature.inputs, list(cfg.model.inputs), "inputs", KIND))
        outputs = _in_order(
            signature.outputs, refine(signature.outputs, list(cfg.model.outputs), "outputs", KIND)
        )
    else:
        inputs, outputs = signature.inputs, signature.outputs
    model = Pt2Model(
        keywords=signature.keywords,
        name=cfg.model.name,
        module=module,
        inputs=inputs,
        outputs=outputs,
        device=device,
        cfg=cfg,
    )
    model._report[REPORT_LOAD_SECONDS] = time.perf_counter() - started
    log.info(
        "loaded pt2 %s from %s (%s) on %s, inputs %s, outputs %s",
        cfg.model.name,
        path,
        engine,
        device,
        [(t.name, t.datatype, t.shape) for t in inputs],
        [(t.name, t.datatype, t.shape) for t in outputs],
    )
    return model
