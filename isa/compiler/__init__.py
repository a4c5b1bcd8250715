"""The compiler: transformer layer graphs (isa.graph) to mesh Programs (docs/compiler.md)."""

from wse_emu.isa.compiler.lower import CompileError
from wse_emu.isa.compiler.pack import CompileReport
from wse_emu.isa.compiler.pipeline import compile_model, load_graph

__all__ = ["CompileError", "CompileReport", "compile_model", "load_graph"]
