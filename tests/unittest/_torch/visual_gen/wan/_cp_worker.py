"""One rank of the Ulysses context-parallel experiment for test_wan_context_parallel.py (run as a script).

    python _cp_worker.py --rank R --world 2 --port P --device cpu|cuda --dtype float32|bfloat16 --out DIR

Every rank builds the same seeded WanTransformer3DModel twice (fingerprinted), runs the single-device path (the
reference, same job), then the context-parallel path (``enable_parallelism(ContextParallelConfig(ulysses_degree=
2))``) twice (run-to-run check), then once more with a planted fault (a dropped shard: rank 1's part of the output
gather replaced by zeros). It writes everything through ``vgct_ext.save_reference`` to ``DIR/rank{R}.safetensors``:
the gathered outputs, this rank's shard of the last block's output (a stream that sharding touches) and the matching
slice of the reference, the all-to-all call count and the weights fingerprints. The test process gates them.

CPU note (diffusers 0.42.1): ``ModelMixin._resolve_parallel_config`` derives the rank's device as
``torch.device(accelerator_type, rank % torch.accelerator.device_count())``, a division by zero on a host without
an accelerator. On the CPU the worker patches that count to 1 for the ``enable_parallelism`` call only; the mesh
(device type "cpu", gloo), the split/gather hooks and the Ulysses all-to-alls are diffusers' own code.
"""

from __future__ import annotations

import argparse
import os
import sys
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # visual_gen/, for _components


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(a.port)
    if a.device == "cuda":
        torch.cuda.set_device(a.rank)
        dev = torch.device("cuda", a.rank)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend, rank=a.rank, world_size=a.world)
    try:
        return run(a, dev, getattr(torch, a.dtype))
    finally:
        dist.destroy_process_group()


def run(a, dev, dtype) -> int:
    import torch

    import _components as C
    import diffusers.models.attention_dispatch as ad
    from diffusers import ContextParallelConfig
    from diffusers.hooks.context_parallel import EquipartitionSharder
    from vgct_ext.experiment import capture, save_reference
    from vgct_ext.probes import count_calls, weights_fingerprint

    last = f"blocks.{C.WAN_CONFIG['num_layers'] - 1}"

    def build():
        return C.load_one(C.wan_transformer, seed=0, device=dev, dtype=dtype, keep_in_fp32=C.WAN_KEEP_FP32)

    noise = C.randn(C.WAN_LATENT, seed=1, device=dev, dtype=dtype)
    text = C.randn(C.WAN_TEXT, seed=2, device=dev, dtype=dtype)
    t = torch.tensor([700.0], device=dev)

    def forward(m):
        return m(hidden_states=noise, timestep=t, encoder_hidden_states=text, return_dict=False)[0]

    ref = build()
    with torch.no_grad(), capture(ref.get_submodule(last)) as ref_cap:
        ref_out = forward(ref)
    ref_block = ref_cap.output  # (1, tokens, dim), the whole sequence

    cp = build()
    fp_ref, fp_cp = weights_fingerprint(ref), weights_fingerprint(cp)
    cfg = ContextParallelConfig(ulysses_degree=a.world)
    if dev.type == "cpu":
        with mock.patch.object(torch.accelerator, "device_count", return_value=1):
            cp.enable_parallelism(config=cfg)
    else:
        cp.enable_parallelism(config=cfg)
    with torch.no_grad(), capture(cp.get_submodule(last)) as cp_cap, \
            count_calls(ad, "_all_to_all_single") as a2a:
        cp_out = forward(cp)
    cp_block = cp_cap.output  # this rank's shard along the sequence
    with torch.no_grad():
        cp_out2 = forward(cp)

    # planted fault: a dropped shard, rank 1's part of the output gather is lost (zeros)
    real_unshard = EquipartitionSharder.unshard.__func__

    def dropping_unshard(cls, tensor, dim, mesh):
        full = real_unshard(cls, tensor, dim, mesh)
        parts = list(full.chunk(mesh.size(), dim=dim))
        parts[1] = torch.zeros_like(parts[1])
        return torch.cat(parts, dim=dim)

    with mock.patch.object(EquipartitionSharder, "unshard", classmethod(dropping_unshard)), torch.no_grad():
        fault_out = forward(cp)

    n = ref_block.shape[1] // a.world
    save_reference(
        os.path.join(a.out, f"rank{a.rank}.safetensors"),
        {"ref_out": ref_out, "cp_out": cp_out, "cp_out_run2": cp_out2, "fault_out": fault_out,
         "cp_block_shard": cp_block, "ref_block_slice": ref_block[:, a.rank * n:(a.rank + 1) * n].contiguous(),
         "ref_block": ref_block},
        meta={"rank": a.rank, "world": a.world, "device": str(dev), "dtype": str(dtype),
              "all_to_all_calls": a2a.count, "weights_ref": f"{fp_ref:016x}", "weights_cp": f"{fp_cp:016x}",
              "ulysses_degree": a.world, "last_block": last},
        weights=ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
