"""``memfit llama-server``: what ``llama-server -m MODEL.gguf …`` puts on a GPU (memfit.cli adds
it by ``register``; ``memfit llamacpp`` is the same command).

The command is named after the binary people run, and its flags are spelled as llama-server
spells them (-ngl, -c, -ctk, -ctv, -fa, -b, -ub, -np, -kvu, -ts, -m), so a pasted
``llama-server`` line works after ``memfit``; flags that do not change memory (--host, --port,
-t, --jinja, --no-mmap…) are accepted and ignored. For Ollama: ``-np`` is
``OLLAMA_NUM_PARALLEL`` and Ollama's runner gets ``-c num_ctx x OLLAMA_NUM_PARALLEL``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from collections.abc import Callable
from typing import Any

from memfit import api
from memfit.cli.runtimes import print_not_modelled
from memfit.errors import NotModelledError, SpecError
from memfit.flags import count_at_most, non_negative_int, positive_int
from memfit.hardware.catalog import get_gpu
from memfit.jobflags import job_from_flags
from memfit.report.llamacpp import llamacpp_json, render_llamacpp
from memfit.spec.llamacpp import FLASH_ATTN, LlamaCppJob
from memfit.spec.rules import MAX_GPUS

EXAMPLES = """examples:
  memfit llama-server llama-3.1-8b:Q4_K_M --gpu RTX-3060 -c 16384
  memfit llama-server ./Qwen2.5-7B-Instruct-Q4_K_M.gguf --gpu RTX-4090 -ngl 99 -fa on \
      -ctk q8_0 -ctv q8_0
  memfit llama-server -m model.gguf --gpu RTX-3090 --gpus 2 -ts 3,1 -c 32768 --json

MODEL: a .gguf file (only its header is read; a split model's first part), or a bundled name /
config.json with a llama-quantize file type (NAME:Q4_K_M, default Q4_K_M). Prints the buffer
lines llama.cpp logs (model, KV cache, compute), the verdict, and the largest -ngl and -c that
fit. Exit 0: fits; 1: tight or does not fit; 2: bad input. How it is modelled: docs/llamacpp.md.
"""

_IGNORED_VALUED = ("--host", "--port", "-t", "--threads", "-tb", "--threads-batch", "--alias",
                   "-a", "--api-key", "--temp", "--seed", "-s", "--chat-template", "-n",
                   "--n-predict", "--main-gpu", "-mg")  # fmt: skip
_IGNORED_SWITCHES = ("--jinja", "--mlock", "--no-mmap", "--cont-batching", "-cb",
                     "--no-webui", "--verbose", "-v", "--metrics")  # fmt: skip


def n_gpu_layers(text: str) -> int | str:
    """-ngl: a layer count, ``auto`` or ``all`` (llama.cpp's spellings; -1 is auto)."""
    if text in ("auto", "all"):
        return text
    if text.lstrip("-").isdigit() and int(text) < 0:
        return "auto" if int(text) == -1 else "all"
    return non_negative_int(text)


def flash_attn(text: str) -> str:
    """-fa on|off|auto (1 / 0 and true / false as the older spelling)."""
    value = {"1": "on", "true": "on", "0": "off", "false": "off"}.get(text.lower(), text.lower())
    if value not in FLASH_ATTN:
        raise argparse.ArgumentTypeError(f"-fa ({text!r}) must be on, off or auto")
    return value


def register(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add ``llama-server`` (alias ``llamacpp``); return its handler by name."""
    p = sub.add_parser(
        "llama-server",
        aliases=["llamacpp"],
        help="will `llama-server` fit this GPU: model / KV / compute buffers, largest -ngl and -c",
        description="Model llama.cpp's start-up buffers (model buffer of the offloaded layers, "
        "KV cache, compute buffer) per GPU and print the lines llama.cpp logs. Flags are "
        "llama-server's; --gpu / --gpus / --json are memfit's.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", nargs="?", help="a .gguf file, or NAME[:FILE_TYPE] (bundled)")
    p.add_argument("-m", "--model", dest="model_flag", metavar="MODEL", default=None,
                   help="as llama-server -m")  # fmt: skip
    p.add_argument("--gpu", required=True, help="GPU name (see `memfit gpus`)")
    p.add_argument("--gpus", type=count_at_most(MAX_GPUS, "GPUs"), default=None,
                   help="identical GPUs (default: one per -ts share, else 1)")  # fmt: skip
    g = p.add_argument_group("llama-server flags")
    g.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", dest="n_gpu_layers",
                   type=n_gpu_layers, default="auto", metavar="N|auto|all",
                   help="layers on the GPU: N, auto or all (default auto: memfit offloads all "
                   "and reports the largest N that fits)")  # fmt: skip
    g.add_argument("-c", "--ctx-size", dest="ctx_size", type=non_negative_int, default=0,
                   help="context tokens, all slots together (default 0: the model's)")  # fmt: skip
    g.add_argument("-ctk", "--cache-type-k", dest="cache_type_k", default="f16",
                   help="K cache type: f16 (default), q8_0, q4_0 …")  # fmt: skip
    g.add_argument("-ctv", "--cache-type-v", dest="cache_type_v", default="f16",
                   help="V cache type (quantized needs -fa on/auto)")  # fmt: skip
    g.add_argument("-fa", "--flash-attn", dest="flash_attn", type=flash_attn, nargs="?",
                   const="on", default="auto", help="on | off | auto (default auto)")  # fmt: skip
    g.add_argument("-b", "--batch-size", dest="batch_size", type=positive_int, default=2048)
    g.add_argument("-ub", "--ubatch-size", dest="ubatch_size", type=positive_int, default=512)
    g.add_argument("-np", "--parallel", dest="parallel", type=positive_int, default=None,
                   help="slots (default auto: 4 sharing a unified KV cache); Ollama: "
                   "OLLAMA_NUM_PARALLEL")  # fmt: skip
    g.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_true",
                   help="one KV cache shared by the slots")  # fmt: skip
    g.add_argument("-ts", "--tensor-split", dest="tensor_split", default=None,
                   help="layer shares per GPU, e.g. 3,1")  # fmt: skip
    p.add_argument("--json", action="store_true", help="machine-readable output")
    ign = p.add_argument_group("accepted and ignored (no effect on memory)")
    for flag in _IGNORED_VALUED:
        ign.add_argument(flag, dest=f"ignored_{flag.lstrip('-')}", default=None,
                         help=argparse.SUPPRESS)  # fmt: skip
    for flag in _IGNORED_SWITCHES:
        ign.add_argument(flag, dest=f"ignored_{flag.lstrip('-')}", action="store_true",
                         help=argparse.SUPPRESS)  # fmt: skip
    return {"llama-server": cmd_llamacpp, "llamacpp": cmd_llamacpp}


def cmd_llamacpp(args: argparse.Namespace) -> int:
    model = args.model_flag or args.model
    if model is None or (args.model_flag and args.model and args.model != args.model_flag):
        raise SpecError("give MODEL once: as the argument or as -m (a .gguf file or NAME:Q4_K_M)")
    job = job_from_flags(LlamaCppJob, args)
    gpu = get_gpu(args.gpu)
    try:
        e = api.estimate(model, job, gpu=gpu)
    except NotModelledError as exc:  # not bad input: said with the nearest answers (exit 1)
        return print_not_modelled("llamacpp", model, gpu, str(exc), as_json=args.json)
    if getattr(args, "extra_notes", None):  # what `memfit check` read from an Ollama Modelfile
        buffers = dataclasses.replace(e.buffers, notes=[*args.extra_notes, *e.buffers.notes])
        e = dataclasses.replace(e, buffers=buffers)
    if args.json:
        print(json.dumps(llamacpp_json(e, server_command(model, job)), indent=2))
    else:
        print(render_llamacpp(e))
    return 0 if e.verdict is not None and e.verdict.fits else 1


def server_command(model: str, job: LlamaCppJob) -> str:
    """The ``llama-server`` line this job is (the flags that differ from the defaults)."""
    parts = ["llama-server", "-m", model]
    if job.n_gpu_layers != "auto":
        parts += ["-ngl", str(job.n_gpu_layers)]
    pairs = (("-c", job.ctx_size, 0), ("-ctk", job.cache_type_k, "f16"),
             ("-ctv", job.cache_type_v, "f16"), ("-fa", job.flash_attn, "auto"),
             ("-b", job.batch_size, 2048), ("-ub", job.ubatch_size, 512),
             ("-np", job.n_parallel, None))  # fmt: skip
    parts += [x for flag, value, default in pairs if value != default for x in (flag, str(value))]
    if job.kv_unified:
        parts.append("-kvu")
    if job.tensor_split:
        parts += ["-ts", ",".join(f"{v:g}" for v in job.tensor_split)]
    return shlex.join(parts)
