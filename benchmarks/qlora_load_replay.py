"""The GPU side of loading a 4-bit model for FSDP-QLoRA / ZeRO3-QLoRA, replayed through memfit's
caching-allocator model: is the loading phase the job's peak?

    PYTHONPATH=src .venv/bin/python benchmarks/qlora_load_replay.py [--model llama-2-70b]

transformers >= 4.39 (PR #29587) quantizes each weight on the GPU and moves the packed data to the
CPU under FSDP or ZeRO-3 (``_load_state_dict_into_meta_model``: ``value.data.to(param_to)``,
``param_to = "cpu"``); the quant state stays on the GPU (only ``.data`` moves). Per weight, in
checkpoint order (safetensors keys sorted: mlp.down/gate/up, self_attn.k/o/q/v), bitsandbytes
0.43 (``Params4bit._quantize``, ``functional.quantize_4bit`` with ``compress_statistics``)
allocates: the bf16 weight on the GPU, an fp32 absmax per 64 values (``torch.zeros``), the packed
output in the quant storage (half a byte a value), the 4-bit code table, the absmax mean
(``offset``), then ``quantize_blockwise(absmax, blocksize=256)``'s fp32 absmax per 256 and its
uint8 output (the kept ``qabsmax``); it frees the fp32 absmax (``del absmax``), the bf16 weight
and, once transformers has moved it, the packed output. Peft's 70B FSDP rows
(benchmarks/data/multigpu_published.jsonl) are ~6-7 GiB over memfit's step; this replay shows the
loading phase is not where that goes (docs/accuracy.md, "peft's Llama-2-70B rows").
"""

from __future__ import annotations

import argparse
import itertools

from memfit.estimate.allocator.caching import CachingAllocatorSim
from memfit.estimate.parallel.shape import read_shape
from memfit.estimate.quant import BNB_4BIT_BLOCKSIZE, BNB_4BIT_CODE_ENTRIES, BNB_NESTED_BLOCKSIZE
from memfit.models import resolve_model

GIB = 2**30
FP32, BF16 = 4, 2


def replay(model: str) -> tuple[int, int, int]:
    """(allocated, reserved, peak reserved) bytes after loading every decoder Linear of ``model``
    quantized on one GPU with nested (double) quantization."""
    s = read_shape(resolve_model(model).spec)
    h, f, kv, q = s.hidden, s.ffn, s.kv_dim, s.q_dim
    layer = [(h, f), (f, h), (f, h), (kv, h), (h, q), (q, h), (kv, h)]  # (out, in), sorted keys
    sim = CachingAllocatorSim()
    key = itertools.count()
    for _ in range(s.n_layers):
        for n_out, n_in in layer:
            n = n_out * n_in
            blocks = -(-n // BNB_4BIT_BLOCKSIZE)
            weight, absmax, packed = next(key), next(key), next(key)
            sim.malloc(weight, n * BF16)
            sim.malloc(absmax, blocks * FP32)
            sim.malloc(packed, n // 2)
            for n_bytes in (
                BNB_4BIT_CODE_ENTRIES * FP32,  # code
                FP32,  # offset
                -(-blocks // BNB_NESTED_BLOCKSIZE) * FP32,  # state2.absmax
                blocks,  # qabsmax (uint8)
            ):
                sim.malloc(next(key), n_bytes)  # kept: the quant state
            sim.free(absmax)
            sim.free(weight)
            sim.free(packed)
    res = sim.result()
    return sim.allocated_bytes, sim.reserved_bytes, res.peak_reserved_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-2-70b")
    args = ap.parse_args()
    allocated, reserved, peak = replay(args.model)
    print(
        f"{args.model}: after loading, allocated {allocated / GIB:.2f} GiB (the quant state), "
        f"reserved {reserved / GIB:.2f} GiB; peak reserved while loading {peak / GIB:.2f} GiB"
    )


if __name__ == "__main__":
    main()
