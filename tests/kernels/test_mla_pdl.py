"""Programmatic dependent launches for the MLA kernel, as the source patch a live investigation measures
(plans/patches/12e-dependent-launch.diff): the patched kernel against the float32 reference in the interpreter on CPU
(where the option is off: it needs a Hopper-class GPU) and in bf16 on a GPU, and the shipped source refusing it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from kinv.kernels.mla_decode_adapter import mla_params
from kinv.kernels.mla_decode_ref import mla_decode_reference
from tests.conftest import HAS_GPU
from tests.kernels.test_mla_decode import make
from tests.utils import assert_verbose_allclose

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "plans" / "patches" / "12e-dependent-launch.diff"


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    """kernels/mla_decode.py with the patch applied, imported beside the shipped module (same package)."""
    from kinv.agent.tools.files.config_text import apply_unified_diff

    source = ROOT / "kernels" / "mla_decode.py"
    path = tmp_path_factory.mktemp("pdl") / "mla_decode_pdl.py"
    path.write_text(apply_unified_diff(source.read_text(), PATCH.read_text(), source))
    name = "kinv.kernels.mla_decode_pdl"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(name, None)


@pytest.mark.parametrize("merge", [0, 1])
def test_the_patched_kernel_is_right_with_and_without_dependent_launches(patched, merge):
    # both kernels take the option; on CPU it is off whatever the config says, and the launch is the seed's
    assert "PDL" in patched._mla_decode_stage1.arg_names and "PDL" in patched._mla_decode_stage2.arg_names
    assert patched._pdl_ok(mla_params(PDL=1), torch.empty(1)) is False
    q, kv, bt, seq, d_v = make([200, 37, 1], 16, "v3", 16, torch.float16)
    ref = mla_decode_reference(q, kv, bt, seq, d_v=d_v)
    scratch = patched.mla_decode_scratch(3, 16, 5, d_v, q.device)
    for pdl in (0, 1, 1):  # twice on one scratch: MERGE's tickets are back at zero between launches
        out = torch.full((3, 16, d_v), float("nan"), dtype=q.dtype, device=q.device)
        patched.mla_decode_launch(q, kv, bt, seq, mla_params(BLOCK_T=16, MERGE=merge, PDL=pdl), d_v=d_v,
                                  num_splits=5, scratch=scratch, out=out)  # fmt: skip
        assert_verbose_allclose(out, ref, 1e-2, 1e-2)
        assert int(scratch["counters"].abs().sum()) == 0


def test_the_shipped_source_refuses_dependent_launches_it_does_not_have():
    from kinv.kernels.adapter import get_adapter
    from kinv.kernels.launch_config import config_hash, describe, validate_config

    seed = {"kernel": "mla_decode", "BLOCK_T": 16, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
    assert config_hash(validate_config({**seed, "PDL": 0})) == "a5991bb8b0f6"  # absent or 0: the seed's config
    assert describe({**seed, "PDL": 1}) == "BT16/BH16/w4/s2/pdl1"
    q, kv, bt, seq, d_v = make([40], 16, "v4flash", 16, torch.float32)
    inputs = {"q": q, "kv_cache": kv, "block_table": bt, "seq_lens": seq, "max_seq_len": 40, "d_v": d_v}
    with pytest.raises(ValueError, match=r"PDL=1 needs programmatic dependent launches in kernels/mla_decode.py.*"
                                         r"12e-dependent-launch.diff"):  # fmt: skip
        get_adapter("mla_decode").launch(inputs, mla_params(PDL=1))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU or torch.cuda.get_device_capability()[0] < 9, reason="needs a Hopper-class GPU")
@pytest.mark.parametrize("merge,tma", [(0, 0), (0, 1), (1, 0)])
def test_gpu_dependent_launches_in_a_cuda_graph_stay_right(patched, merge, tma):
    # captured in a graph of two launches on one scratch (the second launch's stage 1 overwrites what the first
    # one's merge reads: the wait at each kernel's start must order them), replayed twice
    q, kv, bt, seq, d_v = make([4096, 77, 2049], 16, "v3", 64, torch.bfloat16)
    ref = mla_decode_reference(q, kv, bt, seq, d_v=d_v)
    params = mla_params(BLOCK_T=64, CTAS_PER_SM=2, TMA=tma, MERGE=merge, PDL=1)
    scratch = patched.mla_decode_scratch(3, 16, 32, d_v, q.device)
    outs = [torch.full((3, 16, d_v), float("nan"), dtype=q.dtype, device=q.device) for _ in range(2)]

    def launches():
        for out in outs:
            patched.mla_decode_launch(q, kv, bt, seq, params, d_v=d_v, max_seq_len=4096, num_splits=32,
                                      scratch=scratch, out=out)  # fmt: skip

    launches()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launches()
    for _ in range(2):
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for out in outs:
            assert_verbose_allclose(out, ref, 3e-2, 3e-2)
