"""Row-wise softmax: ``y[r, :] = exp(x[r, :] - max(x[r, :])) / sum(exp(x[r, :] - max(x[r, :])))``.

One program takes ``ROWS`` consecutive rows; a row fits one block of ``BLOCK_C`` columns (the next power of two of the
row's length), reduced in float32.
"""

import torch
import triton
import triton.language as tl

MAX_COLS = 16384  # one row in one block


@triton.jit
def _row_softmax(
    # pointers
    X, Y,
    # sizes
    n_rows, n_cols,
    # strides
    stride_x, stride_y,
    # meta-parameters
    ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    for i in tl.static_range(ROWS):
        # -- the row (a program past the last row recomputes it and stores nothing) --
        row = pid * ROWS + i
        src = tl.minimum(row, n_rows - 1)
        x = tl.load(X + src * stride_x + cols, mask=col_ok, other=-float("inf")).to(tl.float32)
        # -- softmax in float32 --
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        y = e / tl.sum(e, axis=0)
        row_ok = (row + cols * 0) < n_rows  # a block-shaped mask (the Triton interpreter refuses a scalar one)
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=col_ok & row_ok)


def row_softmax(x, rows_per_program, num_warps, out=None):
    """Softmax over the last dimension of a 2-D tensor; returns (output, the compiled kernel)."""
    n_rows, n_cols = x.shape
    y = torch.empty_like(x) if out is None else out
    grid = (triton.cdiv(n_rows, rows_per_program),)
    compiled = _row_softmax[grid](x, y, n_rows, n_cols, x.stride(0), y.stride(0), ROWS=rows_per_program,
                                  BLOCK_C=triton.next_power_of_2(n_cols), num_warps=num_warps)
    return y, compiled
