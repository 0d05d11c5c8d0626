"""The Triton kernel: a row-wise RMSNorm, y = x * rsqrt(mean(x^2) + eps) * w, over a rows x hidden matrix.

Each program normalizes ROWS_PER_PROGRAM rows as one [ROWS_PER_PROGRAM, BLOCK_N] block, in float32 whatever the
storage dtype (bf16 in and out on a GPU).  When BLOCK_N covers the hidden size (ONE_PASS) a row is loaded once and
kept in registers; otherwise the row is walked twice in BLOCK_N chunks: once for the sum of squares, once to
normalize and scale (the second walk reads the row again, from L2 when it is still there).  The math is the
RMSNorm of Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019), as LLaMA-style models use it.
"""

import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(
    # pointers
    X, W, Y,
    # sizes and strides
    rows, hidden, stride_x, stride_y,
    # the epsilon under the square root
    eps,
    # meta-parameters
    BLOCK_N: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, ONE_PASS: tl.constexpr,
):
    # ---- the rows this program normalizes ----------------------------------
    r = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_ok = r < rows
    x_rows = X + r[:, None].to(tl.int64) * stride_x
    y_rows = Y + r[:, None].to(tl.int64) * stride_y
    cols = tl.arange(0, BLOCK_N)
    if ONE_PASS:
        # ---- one load: the whole row in registers ---------------------------
        mask = row_ok[:, None] & (cols[None, :] < hidden)
        x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        inv = tl.math.rsqrt(tl.sum(x * x, axis=1) / hidden + eps)
        w = tl.load(W + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        y = x * inv[:, None] * w[None, :]
        tl.store(y_rows + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    else:
        # ---- first walk: the sum of squares, BLOCK_N columns at a time ------
        acc = tl.zeros([ROWS_PER_PROGRAM, BLOCK_N], dtype=tl.float32)
        for c0 in range(0, hidden, BLOCK_N):
            c = c0 + cols
            mask = row_ok[:, None] & (c[None, :] < hidden)
            x = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += x * x
        inv = tl.math.rsqrt(tl.sum(acc, axis=1) / hidden + eps)
        # ---- second walk: normalize and scale -------------------------------
        for c0 in range(0, hidden, BLOCK_N):
            c = c0 + cols
            mask = row_ok[:, None] & (c[None, :] < hidden)
            x = tl.load(x_rows + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + c, mask=c < hidden, other=0.0).to(tl.float32)
            y = x * inv[:, None] * w[None, :]
            tl.store(y_rows + c[None, :], y.to(Y.dtype.element_ty), mask=mask)
