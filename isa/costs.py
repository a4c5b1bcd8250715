"""Cycle costs of tensor ops: the one definition (docs/timing-model.md sections 4 and 6).

Pure Python on integers, importable without NumPy or Numba, so that the compiler can predict
cycles with the very formulas the emulator charges. The reference interpreter calls these
functions as they are; `wse_emu.kernels.cost` registers them with Numba (register_jitable), so
that the Numba core compiles this same source into its loop. Keep them to integer arithmetic,
`max` and `if` (what both Python and Numba's nopython mode accept), calling nothing but each
other.

Arguments, all non-negative integers:
- `width`: the machine's SIMD width for the op's cost class and operand dtypes
  (`machine.simd_width(isa.spec.simd_key(cost, dtypes))`, at least 1);
- `overhead`: the preset's `issue_overhead`, the cycles to start one tensor (DSD) op;
- `n`, `k`: elements of an elementwise op or reduction (all of it, or one chunk);
- `m_rows`, `k_cols`, `n_cols`: a tile product's shape: `mv` is W (M x K) times x (K), `mm` is
  A (M x K) times B (K x N); `n_cols` is 1 for `mv`;
- `by_column`: whether a tile product is issued as one op per column of the tile, as on a
  wafer's PE, which has no matrix instruction (`products_by_column(machine.kind)`).

    compute_cycles(work, width)                      ceil(work / width), exact at any size
    chunk_cycles(k, width, fabric)                   one chunk's duration, overhead excluded
    tensor_cycles(n, width, overhead, fabric)        a whole elementwise op or reduction
    products_by_column(kind)                         the tile-product rule of a machine kind
    matrix_ops(k_cols, n_cols, by_column)            tensor ops a tile product issues
    matrix_cycles(m_rows, k_cols, n_cols, width, overhead, by_column)    a whole mv / mm

The tile-product rule. A PE has no matrix instruction: the Cerebras SDK's GEMV examples
(csl-examples tutorials/gemv-02-memory-dsds onwards, benchmarks/gemv-checkerboard-pattern)
multiply a resident M x K tile by looping over its K columns, one `@fmacs`/`@fmach` DSD op of M
elements per column with x's element as the scalar, and every op pays its start cost (WaferLLM,
OSDI'25, finds its per-PE products overhead-bound for that reason). So on a mesh machine `mv`
costs K ops of `overhead + ceil(M / width)` cycles and `mm` N * K of them; small tiles pay the
overhead once per column, not once per tile. A GPU's SM does have matrix units (tensor cores):
on the HBM presets a tile product stays one block-wide op, `overhead + ceil(M * K * N / width)`.
"""


def compute_cycles(work, width):
    """ceil(work / width) in integers (no float rounding at any size)."""
    return (work + width - 1) // width


def chunk_cycles(k, width, fabric):
    """Duration of a chunk of k elements of an elementwise op or reduction, its issue overhead
    excluded: the SIMD time, and with a fabric operand never faster than one wavelet a
    cycle."""
    dur = compute_cycles(k, width)
    return max(dur, k) if fabric else dur


def tensor_cycles(n, width, overhead, fabric=False):
    """An elementwise op or reduction over n elements whose fabric inputs (if any) are all
    queued when it starts: its issue overhead plus its duration as one chunk. (With fabric
    inputs still arriving it runs in chunks and waits for them: section 6.)"""
    return overhead + chunk_cycles(n, width, fabric)


def products_by_column(kind):
    """Whether a machine of this kind ("mesh" or "hbm") issues a tile product as one tensor op
    per column: a wafer's PE has no matrix instruction; a GPU's SM has tensor cores."""
    return kind == "mesh"


def matrix_ops(k_cols, n_cols, by_column):
    """Tensor ops a tile product issues, each paying the issue overhead: one per column of the
    tile and per column of the result (K for mv, K * N for mm) on a PE, one on a GPU's SM. A
    product with no column (K or N zero) still issues one op."""
    return max(k_cols * n_cols, 1) if by_column else 1


def matrix_cycles(m_rows, k_cols, n_cols, width, overhead, by_column):
    """Cycles of `mv` (n_cols = 1) or `mm`: per column op `overhead + ceil(m_rows / width)`
    when by_column, else one op of `overhead + ceil(m_rows * k_cols * n_cols / width)`."""
    if by_column:
        return (matrix_ops(k_cols, n_cols, True) * overhead
                + k_cols * n_cols * compute_cycles(m_rows, width))
    return overhead + compute_cycles(m_rows * k_cols * n_cols, width)
