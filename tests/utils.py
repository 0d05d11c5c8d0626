"""Helpers shared by tests."""

from __future__ import annotations


def assert_verbose_allclose(actual, expected, atol: float, rtol: float, max_print: int = 5) -> None:
    """allclose that says how many elements differ, where, and by how much."""
    import torch

    actual = actual.float().cpu()
    expected = expected.float().cpu()
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    nonfinite = ~torch.isfinite(actual)
    diff = (actual - expected).abs()
    bad = (diff > atol + rtol * expected.abs()) | nonfinite
    if bad.any():
        idx = bad.nonzero()[:max_print].tolist()
        where = "; ".join(
            f"{tuple(i)}: got {actual[tuple(i)].item():.5g} want {expected[tuple(i)].item():.5g}" for i in idx
        )
        raise AssertionError(
            f"{int(bad.sum())} of {bad.numel()} elements differ (max abs diff {diff.max().item():.3g}, "
            f"{int(nonfinite.sum())} non-finite); first: {where}"
        )
