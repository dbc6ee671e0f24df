"""Which of torch 2.13's public names symgrad has, per module, read from torch itself.

Each public name of ``torch``, ``torch.nn``, ``torch.nn.functional``, ``torch.optim``,
``torch.utils.data`` and ``torch.Tensor`` is *present* (symgrad has the name there),
*deliberately absent* (a rule below matches it: a whole area symgrad does not cover, with the
reason), or *missing* (to do). ``python tests/api_coverage.py`` rewrites
docs/api-coverage.md; tests/test_api_coverage.py fails when that file is stale, so the
figures in it are always today's.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

REPORT = Path(__file__).resolve().parents[1] / "docs" / "api-coverage.md"

#: (pattern on the name, reason): areas symgrad leaves out on purpose. Matched with
#: re.search, so anchor where a whole word is meant.
ABSENT_RULES: list[tuple[str, str]] = [
    (r"complex|conj|^(real|imag|angle|polar|view_as_real|view_as_complex|resolve_neg)"
     r"|is_neg$|_neg_bit", "complex numbers: symgrad's dtypes are real"),
    (r"^q_|quantiz|^dequantize|int_repr|qscheme|^fbgemm|^quantized_|_per_channel|"
     r"_per_tensor", "quantized tensors and kernels"),
    (r"sparse|^(coo|csr|csc|bsr|bsc)|_coo|_csr|_csc|_bsr|_bsc|to_dense|^indices$|"
     r"^values$|_nnz|^ccol|^crow|^row_indices|^col_indices|coalesce|^SparseAdam$",
     "sparse layouts"),
    (r"^mkldnn|^miopen|^cudnn_|^_?cufft|^native_channel_shuffle|^nnpack|^xnnpack|"
     r"^vulkan|^is_vulkan|^mps|^is_mps|^xpu|^is_xpu|^ipu|^is_ipu|^hpu|^mtia|^is_mtia|"
     r"^is_meta|^meta$|^is_maia|^maia|^ort|^is_nested|^nested|^is_mkldnn|^fpga",
     "vendor kernels and devices other than the CPU and CUDA"),
    (r"^(jit|fx|onnx|export|compiler|package|hub|library|overrides|futures|monitor|"
     r"multiprocessing|distributed|ao|quantization|sparse|masked|nested|mtia|xpu|mps|"
     r"testing|signal|accelerator_|profiler|utils_|_dynamo|_inductor|_export|cpu|"
     r"backends_|storage|types|serialization|return_types|contrib|version|hub|"
     r"random|overrides|special|fft|distributions|monitor|func_|compiler)$",
     "torch subsystems outside autograd training on CPU/CUDA (TorchScript, FX, export, "
     "distributed, ...); see the per-module table"),
    (r"Storage$|^TypedStorage|^UntypedStorage|^storage|^untyped_storage|_storage",
     "storage classes: symgrad tensors own NumPy/device arrays, not torch storages"),
    (r"^(ScriptFunction|ScriptModule|ScriptObject|CompilationUnit|FunctionSchema|"
     r"Argument|AliasDb|Graph|Node|Value|Block|Type|Tag|DispatchKey|DispatchKeySet|"
     r"AggregationType|BenchmarkConfig|BenchmarkExecutionStats|ThroughputBenchmark|"
     r"ErrorReport|ExcludeDispatchKeyGuard|ConcreteModuleType|ConcreteModuleTypeBuilder|"
     r"DeserializationStorageContext|FileCheck|Future|Gradient|IODescriptor|JITException|"
     r"LiteScriptModule|LockingLogger|LoggerBase|NoopLogger|PyTorchFileReader|"
     r"PyTorchFileWriter|StaticModule|TracingState|TensorType|.*Type)$",
     "TorchScript and dispatcher internals"),
    (r"^(set_|get_|is_|use_|are_)?deterministic|^(set|get)_(float32_matmul_precision|"
     r"flush_denormal|num_interop_threads|vital|warn_always)|^vitals_enabled|"
     r"^is_warn_always|^(set|get)_autocast|^(set|get)_default_tensor_type|"
     r"^(set|get)_device_module|^(set|get)_deterministic_debug_mode|^is_inference_mode|"
     r"^autocast_|^(get|set)_num_threads|^(get|set)_rng_state|^seed$|^initial_seed",
     "process-wide switches of torch's runtime"),
    (r"^(uint16|uint32|uint64|float8|cfloat|cdouble|chalf|complex|qint|quint|bits|int1|"
     r"int2|int3|int4|int5|int6|int7|uint1|uint2|uint3|uint4|uint5|uint6|uint7|float4)",
     "dtypes symgrad does not have: complex, quantized, sub-byte, float8 and the wide "
     "unsigned integers (float16, bfloat16, int32, int16, int8 and uint8 it has)"),
    (r"^(Script|Argument|CallStack$|Code$|DeepCopyMemoTable|ExecutionPlan|"
     r"GraphExecutorState|OperatorInfo|PRIVATE_OPS|BufferDict|Capsule|Use$|"
     r"SerializationStorageContext|ScriptModuleSerializer|parse_ir|parse_schema|"
     r"import_ir_module|merge_type_from_type_comment|parse_type_comment|unify_type_list|"
     r"fork$|wait$|classes$|cpp$|jagged$|classproperty$|get_file_path$|"
     r"prepare_multiprocessing_environment|thread_safe_generator|"
     r"profiler_allow_cudagraph|hash_tensor$|CompleteArgumentSpec)",
     "TorchScript and dispatcher internals"),
    (r"^Sym[A-Z]|^sym_", "symbolic shapes (torch.compile's tracing internals)"),
    (r"_copy$", "functionalization's out-of-place copies of view ops (use the view op)"),
    (r"^(has_|USE_|TYPE_CHECKING$|compiled_with_cxx11_abi$|torch_version$|torch$)",
     "build flags and import-time internals of the torch package"),
]

#: The same rule set, compiled once.
_COMPILED = [(re.compile(p), why) for p, why in ABSENT_RULES]


def modules():
    """(torch name, torch object, symgrad object) per surveyed namespace."""
    import torch
    import torch.nn.functional
    import torch.optim
    import torch.utils.data

    import symgrad as sg
    import symgrad.testing  # noqa: F401  (a lazily loaded subpackage: count it either way)

    return [("torch", torch, sg), ("torch.nn", torch.nn, sg.nn),
            ("torch.nn.functional", torch.nn.functional, sg.nn.functional),
            ("torch.optim", torch.optim, sg.optim),
            ("torch.utils.data", torch.utils.data, sg.utils.data),
            ("torch.Tensor", torch.Tensor, sg.Tensor)]


def _public(obj) -> list[str]:
    names = []
    for n in dir(obj):
        if n.startswith("_"):
            continue
        value = getattr(obj, n, None)
        # a module torch imported for its own use (torch.nn.functional.math) is no API
        if isinstance(value, types.ModuleType) and not value.__name__.startswith("torch"):
            continue
        names.append(n)
    return names


def absent_reason(name: str) -> str | None:
    for rx, why in _COMPILED:
        if rx.search(name):
            return why
    return None


def survey() -> list[dict]:
    rows = []
    for label, theirs, ours in modules():
        present, absent, missing = [], {}, []
        for n in _public(theirs):
            if hasattr(ours, n):
                present.append(n)
            elif (why := absent_reason(n)) is not None:
                absent.setdefault(why, []).append(n)
            else:
                missing.append(n)
        rows.append({"module": label, "present": present, "absent": absent,
                     "missing": missing})
    return rows


def render(rows: list[dict]) -> str:
    import torch

    out = ["# API coverage against torch " + torch.__version__.split("+")[0], "",
           "Generated by `python tests/api_coverage.py` from torch itself (the public names of",
           "each module); tests/test_api_coverage.py fails when this file is stale. *Present*:",
           "symgrad has the name in the same place. *Deliberately absent*: an area symgrad does",
           "not cover (docs/differences.md says why). *Missing*: not done yet.", "",
           "| module | torch names | present | deliberately absent | missing |",
           "|---|---|---|---|---|"]
    for r in rows:
        n_abs = sum(len(v) for v in r["absent"].values())
        total = len(r["present"]) + n_abs + len(r["missing"])
        out.append(f"| `{r['module']}` | {total} | {len(r['present'])} | {n_abs} | "
                   f"{len(r['missing'])} |")
    for r in rows:
        out += ["", f"## `{r['module']}`", "", "Missing: " + (
            ", ".join(f"`{n}`" for n in r["missing"]) if r["missing"] else "none") + ".", ""]
        for why, names in sorted(r["absent"].items()):
            out.append(f"- Deliberately absent ({why}): {len(names)} names.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    REPORT.write_text(render(survey()))
    print(f"wrote {REPORT}", file=sys.stderr)
