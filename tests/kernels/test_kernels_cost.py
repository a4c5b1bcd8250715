"""The cycle-cost formulas of isa/costs.py (docs/timing-model.md sections 4 and 6), as the
compiler calls them (pure Python) and as the Numba core compiles them (kernels/cost.py).

That the core and the reference charge these formulas is tested on programs in
tests/emulator/test_core_timing.py; here, the formulas' own properties."""

import itertools
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

from wse_emu.isa import costs
from wse_emu.kernels import cost as jitted


@njit(cache=False)
def _in_numba(m, k, n, width, overhead, by_column, fabric):
    return (jitted.compute_cycles(m * k, width), jitted.chunk_cycles(m, width, fabric),
            jitted.tensor_cycles(m, width, overhead, fabric), jitted.matrix_ops(k, n, by_column),
            jitted.matrix_cycles(m, k, n, width, overhead, by_column))


@pytest.mark.parametrize("work,width,want", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2),
                                             (4096, 8, 512), (4097, 8, 513), (7, 1, 7)])
def test_compute_cycles_is_the_ceiling_of_work_over_width(work, width, want):
    assert costs.compute_cycles(work, width) == want


def test_costs_are_exact_integers_at_wafer_scale():
    # 3 * 2**52 + 1 is where float arithmetic would start to round the ceiling
    work = 3 * (1 << 52) + 1
    assert costs.compute_cycles(work, 3) == (1 << 52) + 1
    assert costs.tensor_cycles(work, 3, 10) == (1 << 52) + 11
    assert _in_numba(work, 1, 1, 3, 10, True, False)[2] == (1 << 52) + 11


def test_elementwise_ops_pay_one_overhead_and_the_fabric_bounds_them():
    assert costs.tensor_cycles(0, 2, 5) == 5
    assert costs.tensor_cycles(64 * 64, 4, 3) == 3 + 1024
    assert costs.tensor_cycles(100, 4, 3, fabric=True) == 3 + 100  # one wavelet a cycle
    assert costs.chunk_cycles(100, 4, True) == 100
    assert costs.chunk_cycles(100, 4, False) == 25
    assert costs.chunk_cycles(9, 4, True) == 9 and costs.chunk_cycles(0, 4, True) == 0


def test_the_core_compiles_the_same_formulas():
    """Every function, through Numba, gives what the pure-Python source gives."""
    for m, k, n, width, overhead, by_column, fabric in itertools.product(
            (0, 1, 7, 64, 1000), (0, 1, 5, 64), (1, 3), (1, 4, 8, 1892), (0, 3, 32),
            (True, False), (True, False)):
        python = (costs.compute_cycles(m * k, width), costs.chunk_cycles(m, width, fabric),
                  costs.tensor_cycles(m, width, overhead, fabric),
                  costs.matrix_ops(k, n, by_column),
                  costs.matrix_cycles(m, k, n, width, overhead, by_column))
        assert _in_numba(np.int64(m), np.int64(k), np.int64(n), np.int64(width),
                         np.int64(overhead), by_column, fabric) == python


@pytest.mark.parametrize("width", [1, 4, 8])
@pytest.mark.parametrize("overhead", [0, 3, 7])
def test_a_tile_product_is_one_op_a_column(width, overhead):
    for m, k, n in itertools.product((1, 3, 8, 33, 64), (1, 2, 5, 16), (1, 2, 3)):
        per_op = overhead + -(-m // width)
        assert costs.matrix_ops(k, n, True) == k * n
        assert costs.matrix_cycles(m, k, n, width, overhead, True) == k * n * per_op
        # one more column of the tile adds one more op, of M elements
        assert (costs.matrix_cycles(m, k + 1, n, width, overhead, True)
                - costs.matrix_cycles(m, k, n, width, overhead, True)) == n * per_op


@pytest.mark.parametrize("width", [1, 4, 8])
def test_the_same_macs_in_more_columns_cost_more(width):
    """A tile of M x K = 4096 MACs: the more columns (ops), the more overheads; with M a
    multiple of the width, exactly one issue overhead more a column than the whole tile as one
    op."""
    overhead = 3
    costs_by_k = []
    for k in (1, 2, 4, 8, 16, 32, 64):
        m = 4096 // k
        c = costs.matrix_cycles(m, k, 1, width, overhead, True)
        costs_by_k.append(c)
        if m % width == 0:
            assert c - costs.matrix_cycles(m, k, 1, width, overhead, False) == (k - 1) * overhead
    assert costs_by_k == sorted(costs_by_k) and len(set(costs_by_k)) == len(costs_by_k)


def test_an_empty_product_still_issues_one_op():
    assert costs.matrix_cycles(64, 0, 1, 4, 3, True) == 3
    assert costs.matrix_cycles(64, 5, 0, 4, 3, True) == 3
    assert costs.matrix_cycles(0, 5, 1, 4, 3, True) == 5 * 3


def test_gpu_sms_issue_a_tile_product_as_one_op():
    assert not costs.products_by_column("hbm") and costs.products_by_column("mesh")
    assert costs.matrix_ops(4096, 1, False) == 1
    assert costs.matrix_cycles(128, 4096, 1, 1892, 32, False) == 32 + -(-128 * 4096 // 1892)


def test_the_module_imports_without_numba_or_numpy():
    """The compiler imports it to predict cycles: it must not pull in the emulator's stack."""
    code = ("import sys; import wse_emu.isa.costs; "
            "bad = [m for m in ('numba', 'numpy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
