"""The cycle-cost functions of wse_emu.isa.costs, made callable from the Numba core.

isa/costs.py is the one definition (pure Python, for the compiler and the reference
interpreter). Registering each function with Numba (register_jitable) lets jitted code call it
by the same name: Numba compiles the same source into the caller, so the core cannot drift from
the reference or from the compiler's predictions. Import the functions from here in jitted code
(importing this module is what registers them).
"""

from numba.extending import register_jitable

from wse_emu.isa import costs

# every function of isa.costs, including those only the others call, so each compiles
for _f in (costs.compute_cycles, costs.chunk_cycles, costs.tensor_cycles, costs.matrix_ops,
           costs.matrix_cycles):
    register_jitable(_f)

compute_cycles = costs.compute_cycles
chunk_cycles = costs.chunk_cycles
tensor_cycles = costs.tensor_cycles
matrix_ops = costs.matrix_ops
matrix_cycles = costs.matrix_cycles
