"""The compiler: transformer layer graphs (isa.graph) to mesh Programs (docs/compiler.md)."""

from isa.compiler.lower import CompileError
from isa.compiler.pack import CompileReport
from isa.compiler.pipeline import compile_model, load_graph

__all__ = ["CompileError", "CompileReport", "compile_model", "load_graph"]
