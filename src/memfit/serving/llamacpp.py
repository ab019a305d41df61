"""What ``llama-server -m MODEL.gguf -ngl N -c C ...`` puts on each GPU (torch-free): the buffers
llama.cpp logs at start-up (the verdict and the largest ``-ngl`` / ``-c`` that fit:
:mod:`memfit.estimate.llamacpp`).

Per device, as llama.cpp allocates them (ggml-org/llama.cpp, src/llama-model.cpp
``load_tensors`` and src/llama-context.cpp, src/llama-kv-cache.cpp):

- **model buffer** (``load_tensors: CUDA0 model buffer size``): the tensors of the offloaded
  layers. The output layer (``output.weight``, ``output_norm``) is layer ``n_layer`` and counts
  first: ``-ngl N`` offloads it and the last N - 1 repeating layers (``i_gpu_start = n_layer + 1
  - N``; llama.cpp before mid-2025 used ``n_layer - N``, the output only when N > n_layer):
  "offloading output layer to GPU / offloading 19 repeating layers / offloaded 20/49". The token
  embedding always stays in host memory ("there is very little benefit to offloading the input
  layer"); a model with tied embeddings loads a second copy of it as the output on the GPU.
  Layers spread over GPUs by the cumulative ``-ts`` shares (``upper_bound(splits,
  (il - i_gpu_start) / act_gpu_layers)``), even shares by default on identical GPUs.
- **KV cache** (``llama_kv_cache: CUDA0 KV buffer size``): per layer, on the device holding the
  layer, ``cells x (row(type_k, n_embd_k_gqa) + row(type_v, n_embd_v_gqa))``; ``cells`` is -c
  padded to 256 (``GGML_PAD(n_ctx, 256)``; with -np N and no unified cache, each slot gets
  ``GGML_PAD(n_ctx / N, 256)``); sliding-window layers hold ``min(cells, GGML_PAD(n_swa x
  (unified ? n_seq : 1) + n_ubatch, 256))`` cells (src/llama-kv-cache-iswa.cpp).
- **compute buffer** (``llama_context: CUDA0 compute buffer size``): the graph reserved for
  ``n_ubatch`` tokens, its tensors reusing memory (ggml-alloc). Modelled as the largest of the
  attention scratch (without flash attention the f32 scores and their softmax,
  ``2 x n_kv x n_ubatch x n_head x 4`` bytes; with it, the q/k/v rows), the FFN activations and
  the logits (``n_vocab x n_ubatch x 4`` on the device holding the output), plus the residual
  stream; with layers left on the host, llama.cpp runs their large-batch matmuls on the GPU
  (``op_offload``) and copies the largest such weight into this buffer. The constants
  (:data:`COMPUTE_TERMS`) are fitted to published logs (benchmarks/data/llamacpp_logs.jsonl).
- **CUDA pool** (not logged): ggml-cuda's per-device memory pool (ggml/src/ggml-cuda/ggml-cuda.cu,
  ``ggml_cuda_pool_vmm``: physical memory is mapped as the pool grows and never unmapped) holds
  the temporaries of each matmul and attention op. Its peak (:func:`pool_bytes`) comes at a full
  ``n_ubatch`` with a full cache: without flash attention, the batched cuBLAS ``kqv`` product
  (``ggml_cuda_mul_mat_batched_cublas``) converts the f32 softmaxed scores to f16 in the pool,
  ``n_kv x n_ubatch x n_head x 2`` bytes; with flash attention and a quantized cache, the kernels
  (fattn-common.cuh ``launch_fattn``) convert one layer's K and V to f16 there.
- **CUDA context** and cuBLAS workspace: :func:`memfit.hardware.overhead.device_overhead`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memfit.hardware.gpu import GPU
from memfit.hardware.overhead import device_overhead
from memfit.models.ggml_types import row_bytes
from memfit.models.gguf import GgufModel
from memfit.spec.llamacpp import LlamaCppJob
from memfit.units import MiB

#: llama-context.cpp: ``cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256)`` (PR #17046).
CTX_PAD = 256
F32 = 4
F16 = 2
#: Compute-graph terms (T = n_ubatch tokens): at the attention, the KQ mask (f16, n_kv x T), four
#: f32 (T x n_embd) activations (input, norm, Q, output) and four (T x n_embd_k_gqa) rows (K, V
#: and their copies into the cache), plus without flash attention the f32 scores; the FFN keeps
#: gate, up and their product (FFN_TENSORS x T x n_ff) beside its input; the output keeps the
#: logits beside the normed input. Fitted to three logs without flash attention that agree to the
#: MiB (benchmarks/data/llamacpp_logs.jsonl: Llama-3.1-8B 560.00, Llama-3.1-70B 588.01 and
#: 1104.00 MiB; at -c 512 the logits moment, 258.50 MiB, also to the MiB). The host (CUDA_Host)
#: buffer, the input rows and the f32 KQ mask built on the host, fits the CUDA logs (24.01,
#: 32.01, 9.01 MiB).
COMPUTE_TERMS = {"MASK_BYTES": 2, "ATTN_ACTIVATIONS": 4, "ATTN_KV_ROWS": 4, "FFN_TENSORS": 3}


@dataclass(frozen=True, kw_only=True)
class DeviceBuffers:
    """One device's buffers, as llama.cpp logs them."""

    name: str  # CUDA0 ...
    n_layers: int
    model_bytes: int
    kv_bytes: int
    compute_bytes: int
    context_bytes: int  # CUDA context + cuBLAS workspace (not logged by llama.cpp)
    pool_bytes: int = 0  # ggml-cuda's pool at its peak (not logged by llama.cpp): pool_bytes()

    @property
    def buffers_bytes(self) -> int:
        """What the process allocates on this device: the logged buffers and the CUDA pool."""
        return self.model_bytes + self.kv_bytes + self.compute_bytes + self.pool_bytes

    @property
    def total_bytes(self) -> int:
        return self.buffers_bytes + self.context_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.name, "n_layers": self.n_layers, "model_bytes": self.model_bytes,
            "kv_bytes": self.kv_bytes, "compute_bytes": self.compute_bytes,
            "pool_bytes": self.pool_bytes, "context_bytes": self.context_bytes,
            "total_bytes": self.total_bytes,
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class LlamaCppBuffers:
    """llama.cpp's start-up on one host: per-GPU and host buffers (the verdict and the fit
    answers: :class:`memfit.estimate.llamacpp.LlamaCppEstimate`)."""

    model: str
    source: str
    gpu: str | None
    job: LlamaCppJob
    n_layer: int
    n_gpu_layers: int  # resolved: 0 .. n_layer + 1
    n_ctx: int  # KV cells in all (padded)
    n_ctx_seq: int
    n_seq: int
    n_swa_cells: int | None
    flash_attn: bool
    devices: tuple[DeviceBuffers, ...]
    host_model_bytes: int  # CPU_Mapped model buffer
    host_kv_bytes: int
    host_compute_bytes: int  # CUDA_Host compute buffer
    output_buffer_bytes: int  # CUDA_Host output buffer (logits of n_seq tokens)
    kv_k_bytes: int
    kv_v_bytes: int
    notes: tuple[str, ...] = ()

    @property
    def busiest(self) -> DeviceBuffers:
        return max(self.devices, key=lambda d: d.total_bytes)

    @property
    def peak_allocated_bytes(self) -> int:
        return self.busiest.buffers_bytes

    @property
    def device_used_bytes(self) -> int:
        return self.busiest.total_bytes

    def log_lines(self) -> list[str]:
        """The lines llama.cpp prints for these buffers (MiB as llama.cpp rounds them)."""
        m = 1 / MiB
        out = [f"load_tensors: offloaded {self.n_gpu_layers}/{self.n_layer + 1} layers to GPU"]
        out += [f"load_tensors: {d.name:>9} model buffer size = {d.model_bytes * m:10.2f} MiB"
                for d in self.devices if d.model_bytes]  # fmt: skip
        host, output = self.host_model_bytes * m, self.output_buffer_bytes * m
        fa = "enabled" if self.flash_attn else "disabled"
        out += [
            f"load_tensors: CPU_Mapped model buffer size = {host:10.2f} MiB",
            f"llama_context: n_ctx = {self.n_ctx}, n_ctx_seq = {self.n_ctx_seq}, "
            f"n_seq_max = {self.n_seq}, flash_attn = {fa}",
            f"llama_context:  CUDA_Host  output buffer size = {output:10.2f} MiB",
        ]
        out += [f"llama_kv_cache: {d.name:>9} KV buffer size = {d.kv_bytes * m:10.2f} MiB"
                for d in self.devices if d.kv_bytes]  # fmt: skip
        if self.host_kv_bytes:
            cpu_kv = self.host_kv_bytes * m
            out.append(f"llama_kv_cache:       CPU KV buffer size = {cpu_kv:10.2f} MiB")
        kv = self.kv_k_bytes + self.kv_v_bytes
        out.append(
            f"llama_kv_cache: size = {kv * m:.2f} MiB ({self.n_ctx} cells, {self.n_layer} layers, "
            f"{self.n_seq}/{self.n_seq} seqs), K ({self.job.cache_type_k}): "
            f"{self.kv_k_bytes * m:.2f} MiB, V ({self.job.cache_type_v}): "
            f"{self.kv_v_bytes * m:.2f} MiB"
        )
        out += [f"llama_context: {d.name:>9} compute buffer size = {d.compute_bytes * m:10.2f} MiB"
                for d in self.devices]  # fmt: skip
        host_c = self.host_compute_bytes * m
        out.append(f"llama_context:  CUDA_Host compute buffer size = {host_c:10.2f} MiB")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "llamacpp", "model": self.model, "source": self.source, "gpu": self.gpu,
            "n_layer": self.n_layer, "n_gpu_layers": self.n_gpu_layers, "n_ctx": self.n_ctx,
            "n_ctx_seq": self.n_ctx_seq, "n_seq": self.n_seq, "n_swa_cells": self.n_swa_cells,
            "flash_attn": self.flash_attn,
            "cache_type_k": self.job.cache_type_k, "cache_type_v": self.job.cache_type_v,
            "n_ubatch": self.job.ubatch_size,
            "devices": [d.to_json() for d in self.devices],
            "host_model_bytes": self.host_model_bytes, "host_kv_bytes": self.host_kv_bytes,
            "host_compute_bytes": self.host_compute_bytes,
            "output_buffer_bytes": self.output_buffer_bytes,
            "kv_k_bytes": self.kv_k_bytes, "kv_v_bytes": self.kv_v_bytes,
            "device_used_bytes": self.device_used_bytes,
            "log_lines": self.log_lines(), "notes": list(self.notes),
        }  # fmt: skip


# -- the accounting ------------------------------------------------------------------------------
def _pad(n: int, to: int = CTX_PAD) -> int:
    return (n + to - 1) // to * to


def resolve_ngl(model: GgufModel, job: LlamaCppJob) -> int:
    """-ngl as llama.cpp applies it: 0 .. n_layer + 1 (auto / all: every layer and the output)."""
    if isinstance(job.n_gpu_layers, str):
        return model.n_layer + 1
    return min(job.n_gpu_layers, model.n_layer + 1)


def layer_devices(model: GgufModel, ngl: int, job: LlamaCppJob) -> list[int | None]:
    """Device index of layers 0 .. n_layer (the last: the output layer); None: the host."""
    n_dev = job.n_gpus
    shares = job.tensor_split or (1.0,) * n_dev
    total = sum(shares)
    splits, acc = [], 0.0
    for s in shares:
        acc += s / total
        splits.append(acc)
    start = max(model.n_layer + 1 - ngl, 0)  # the output layer counts first (module docstring)
    act = min(ngl, model.n_layer + 1)
    out: list[int | None] = []
    for il in range(model.n_layer + 1):
        if il < start or il - start >= act:
            out.append(None)
            continue
        x = (il - start) / act
        out.append(min(next((i for i, s in enumerate(splits) if s > x), n_dev - 1), n_dev - 1))
    return out


def kv_cells(model: GgufModel, job: LlamaCppJob) -> tuple[int, int, int, int | None]:
    """(n_ctx, n_ctx_seq, n_streams, SWA cells per stream or None)."""
    n_seq = job.slots
    n_ctx = _pad(job.ctx_size or model.n_ctx_train)
    if job.unified:
        n_ctx_seq, streams = n_ctx, 1
    else:
        n_ctx_seq = _pad(n_ctx // n_seq)
        n_ctx, streams = n_ctx_seq * n_seq, n_seq
    swa = None
    if model.n_swa and any(model.swa_layers):
        want = model.n_swa * (n_seq if job.unified else 1) + job.ubatch_size
        swa = min(n_ctx_seq, _pad(want))
    return n_ctx, n_ctx_seq, streams, swa


def _layer_kv(model: GgufModel, job: LlamaCppJob, il: int, cells: int) -> tuple[int, int]:
    return (cells * row_bytes(job.cache_type_k, model.n_embd_k_gqa(il)),
            cells * row_bytes(job.cache_type_v, model.n_embd_v_gqa(il)))  # fmt: skip


def compute_bytes(model: GgufModel, job: LlamaCppJob, *, n_kv: int, flash: bool,
                  output_here: bool, offloaded_weight_bytes: int) -> int:  # fmt: skip
    """One GPU's compute buffer: the largest of three moments of the reserved graph
    (:data:`COMPUTE_TERMS`), plus any host weight copied in for a large-batch matmul."""
    t = min(job.ubatch_size, n_kv)
    act = t * model.n_embd * F32
    kv_row = t * max(model.n_embd_k_gqa(il) for il in range(model.n_layer)) * F32
    mask = n_kv * t * COMPUTE_TERMS["MASK_BYTES"]
    attn = mask + COMPUTE_TERMS["ATTN_ACTIVATIONS"] * act + COMPUTE_TERMS["ATTN_KV_ROWS"] * kv_row
    if not flash:  # the f32 scores; softmax runs in place (ggml-alloc ggml_op_can_inplace)
        attn += n_kv * t * model.n_head * F32
    ffn = COMPUTE_TERMS["FFN_TENSORS"] * t * model.n_ff * F32 + act
    logits = t * model.n_vocab * F32 + act if output_here else 0
    return max(attn, ffn, logits) + offloaded_weight_bytes


def pool_bytes(model: GgufModel, job: LlamaCppJob, *, n_kv: int, flash: bool) -> int:
    """ggml-cuda's pool at its peak on a device holding attention layers (module docstring):
    without flash attention the f16 copy of the softmaxed scores (``kqv``: n_kv x T x n_head x
    F16); with it, one layer's K and V converted to f16 when the cache is quantized; else the
    small matmul temporaries only (the q8_1 copy of the activations: not counted)."""
    t = min(job.ubatch_size, n_kv)
    if not flash:
        return n_kv * t * model.n_head * F16
    quantized = [job.cache_type_k != "f16", job.cache_type_v != "f16"]
    if not any(quantized):
        return 0
    widest = max(range(model.n_layer), key=model.n_embd_k_gqa)
    k = n_kv * model.n_embd_k_gqa(widest) * F16 if quantized[0] else 0
    v = n_kv * model.n_embd_v_gqa(widest) * F16 if quantized[1] else 0
    return k + v


def llamacpp_buffers(model: GgufModel, job: LlamaCppJob, gpu: GPU | None) -> LlamaCppBuffers:
    """The buffers of ``job`` on ``gpu`` (``job.n_gpus`` of them; None: no CUDA context named)."""
    ngl = resolve_ngl(model, job)
    where = layer_devices(model, ngl, job)
    n_ctx, n_ctx_seq, streams, swa = kv_cells(model, job)
    flash = job.flash_attn != "off"  # auto: CUDA builds have flash attention for these heads
    n_dev = job.n_gpus
    model_b, kv_b, layers = [0] * n_dev, [0] * n_dev, [0] * n_dev
    host_model = model.tensor_bytes("token_embd.weight")
    host_kv = kv_k = kv_v = 0
    for il in range(model.n_layer):
        cells = (swa if swa is not None and model.swa_layers[il] else n_ctx_seq) * streams
        k, v = _layer_kv(model, job, il, cells)
        kv_k, kv_v = kv_k + k, kv_v + v
        dev = where[il]
        if dev is None:
            host_model += model.layer_bytes(il)
            host_kv += k + v
        else:
            model_b[dev] += model.layer_bytes(il)
            kv_b[dev] += k + v
            layers[dev] += 1
    out_dev = where[model.n_layer]
    out_bytes = model.tensor_bytes("output.weight") or model.tensor_bytes("token_embd.weight")
    out_bytes += model.tensor_bytes("output_norm.weight")
    if out_dev is None:
        host_model += out_bytes
    else:
        model_b[out_dev] += out_bytes
    cpu_weights = [
        t.n_bytes for t in model.tensors
        if len(t.shape) >= 2 and t.name != "token_embd.weight"
        and (where[t.layer] if t.layer is not None else out_dev) is None
    ]  # fmt: skip
    offload = max(cpu_weights, default=0) if ngl > 0 else 0
    overhead = device_overhead(gpu.arch if gpu else None, training=False).total_bytes
    n_kv = n_ctx_seq if not job.unified else n_ctx
    devices = tuple(
        DeviceBuffers(
            name=f"CUDA{i}", n_layers=layers[i], model_bytes=model_b[i], kv_bytes=kv_b[i],
            compute_bytes=compute_bytes(
                model, job, n_kv=n_kv, flash=flash,
                output_here=(out_dev == i) or (out_dev is None and i == 0 and ngl > 0),
                offloaded_weight_bytes=offload if i == 0 else 0,
            ) if (layers[i] or out_dev == i or i == 0) else 0,
            pool_bytes=pool_bytes(model, job, n_kv=n_kv, flash=flash) if layers[i] else 0,
            context_bytes=overhead,
        )
        for i in range(n_dev)
    )  # fmt: skip
    t = min(job.ubatch_size, n_ctx)
    host_compute = t * model.n_embd * F32 + n_ctx * t * F32  # the input rows and the f32 KQ mask
    if ngl == 0:
        host_compute = compute_bytes(model, job, n_kv=n_ctx, flash=flash, output_here=True,
                                     offloaded_weight_bytes=0)  # fmt: skip
    return LlamaCppBuffers(
        model=model.name, source=model.source, gpu=gpu.name if gpu else None, job=job,
        n_layer=model.n_layer, n_gpu_layers=ngl, n_ctx=n_ctx, n_ctx_seq=n_ctx_seq,
        n_seq=job.slots, n_swa_cells=swa, flash_attn=flash, devices=devices,
        host_model_bytes=host_model, host_kv_bytes=host_kv, host_compute_bytes=host_compute,
        output_buffer_bytes=model.n_vocab * job.slots * F32, kv_k_bytes=kv_k, kv_v_bytes=kv_v,
        notes=tuple(_notes(model, job, gpu)),
    )  # fmt: skip


def _notes(model: GgufModel, job: LlamaCppJob, gpu: GPU | None) -> list[str]:
    out = [f"model tensors from the {model.source}"]
    if job.n_gpu_layers == "auto":
        out.append(
            "-ngl auto: memfit offloads every layer; llama.cpp's --fit (on by default) would "
            "instead shrink an unset -c, then -ngl, to leave 1 GiB free per GPU"
        )
    if job.ctx_size == 0:
        out.append(f"-c 0: the trained context, {model.n_ctx_train:,} tokens")
    if job.flash_attn == "auto":
        out.append("-fa auto: taken as on (CUDA builds support flash attention for these heads)")
    if job.n_parallel is None:
        out.append("-np auto: 4 slots sharing one unified KV cache of -c tokens")
    if job.n_gpus > 1:
        out.append("several GPUs: compute buffers are modelled per GPU without pipeline copies")
    if gpu is not None:
        ctx = device_overhead(gpu.arch, training=False).total_bytes / MiB
        out.append(
            f"CUDA context and cuBLAS workspace: {ctx:.0f} MiB per GPU (not in llama.cpp's log)"
        )
    if job.flash_attn == "off":
        out.append(
            "-fa off: ggml-cuda's pool holds an f16 copy of the attention scores of one "
            "ubatch (n_kv x n_ubatch x n_head x 2 bytes; not in llama.cpp's log)"
        )
    return out
