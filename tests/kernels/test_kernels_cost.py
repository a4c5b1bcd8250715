"""Cycle cost functions of tensor ops (docs/timing-model.md sections 4 and 6)."""

import pytest

from wse_emu.kernels.cost import compute_cycles, fabric_chunk_cycles, tensor_cycles


@pytest.mark.parametrize("work,width,want", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2),
                                             (4096, 8, 512), (4097, 8, 513), (7, 1, 7)])
def test_compute_cycles_is_the_ceiling_of_work_over_width(work, width, want):
    assert compute_cycles(work, width) == want


def test_tensor_cycles_adds_the_issue_overhead():
    assert tensor_cycles(0, 2, 5) == 5
    assert tensor_cycles(64 * 64, 4, 3) == 3 + 1024
    assert tensor_cycles(64 * 64 + 1, 4, 3) == 3 + 1025


def test_costs_are_exact_integers_at_wafer_scale():
    # 3 * 2**52 + 1 is where float arithmetic would start to round the ceiling.
    work = 3 * (1 << 52) + 1
    assert compute_cycles(work, 3) == (1 << 52) + 1
    assert tensor_cycles(work, 3, 10) == (1 << 52) + 11


def test_fabric_chunks_move_at_most_one_wavelet_per_cycle():
    assert fabric_chunk_cycles(100, 4, 100) == 100  # SIMD would take 25: the fabric bounds it
    assert fabric_chunk_cycles(100 * 64, 4, 100) == 1600  # mv-like work: compute bounds it
    assert fabric_chunk_cycles(9, 4, 2) == 3
    assert fabric_chunk_cycles(0, 4, 0) == 0
