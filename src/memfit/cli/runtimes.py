"""``fit / plan / upgrade --runtime sglang | llama.cpp``: the serving engines other than vLLM,
reached from the commands people already use (``--runtime vllm``: memfit.cli.vllm).

The job is the command's own flags: the context is ``--seq`` + ``--new-tokens``, one replica
over ``--tp`` (or ``--gpus``) GPUs, ``--concurrency`` / ``--batch`` requests. What each verb
answers:

* **sglang** — ``fit --solve max-model-len``: the largest ``--context-length`` that starts;
  ``fit --solve concurrency``: how many requests of the whole context the KV pool holds (SGLang's
  ``max_total_num_tokens // context_length``). ``plan`` / ``upgrade``: SGLang's start-up of the
  asked context on the GPU (its verdict: starts / fails), with the same two largest values —
  SGLang's own configurations (mem-fraction, chunked prefill) are not searched
  (``memfit plan --runtime vllm`` searches vLLM's).
* **llama.cpp** — ``fit --solve max-model-len`` (or ``seq``): the largest ``-c``;
  ``fit --solve n-gpu-layers``: the largest ``-ngl``. ``plan`` / ``upgrade``: ``memfit
  llama-server`` on the asked context (-c = context x concurrency, llama-server's slots), which
  prints both largest values.
"""

from __future__ import annotations

import argparse
import json

from memfit import api
from memfit.errors import MemfitError, NotModelledError, SpecError
from memfit.flags import EXIT_DOES_NOT_FIT, EXIT_OK
from memfit.hardware.catalog import GPU, get_gpu
from memfit.report.llamacpp import llamacpp_json, render_llamacpp
from memfit.report.not_modelled import not_modelled_json, render_server_not_modelled
from memfit.report.sglang import render_sglang, sglang_json
from memfit.serving.sglang_command import launch_command
from memfit.serving.startup import served_as_decoder
from memfit.spec.llamacpp import LlamaCppJob
from memfit.spec.sglang import SglangConfig

__all__ = ["OTHER_RUNTIMES", "cmd_fit_runtime", "cmd_plan_runtime", "print_not_modelled"]

#: The --runtime values this module answers (vllm: memfit.cli.vllm; hf: the text engines).
OTHER_RUNTIMES = ("sglang", "llama.cpp")
#: fit --solve for each runtime -> what the route solves.
_SOLVES = {
    "sglang": {"max-model-len": "context-length", "concurrency": "max-running-requests"},
    "llama.cpp": {"max-model-len": "ctx-size", "seq": "ctx-size", "n-gpu-layers": "n-gpu-layers"},
}


def _length(args: argparse.Namespace) -> int:
    return int(args.seq) + int(getattr(args, "new_tokens", None) or 0)


def _requests(args: argparse.Namespace) -> int:
    return int(getattr(args, "concurrency", None) or getattr(args, "batch", None) or 1)


def _gpu(args: argparse.Namespace, verb: str) -> GPU:
    if getattr(args, "gpu", None) is None or getattr(args, "gpu_memory", None) is not None:
        raise SpecError(
            f"{verb} --runtime {args.runtime} needs --gpu NAME (the server's budget is a GPU's "
            "total memory)"
        )
    return get_gpu(args.gpu)


def _tp(args: argparse.Namespace) -> int:
    tp, gpus = getattr(args, "tp", None) or 1, getattr(args, "gpus", None) or 1
    return tp if tp > 1 else gpus


def sglang_config(args: argparse.Namespace, *, context: int | None) -> SglangConfig:
    quant = getattr(args, "quant", None)
    return SglangConfig(
        tp_size=_tp(args),
        context_length=context,
        quantization="fp8" if quant == "fp8" else None,
        kv_cache_dtype="fp8_e4m3" if getattr(args, "kv_cache_dtype", "auto") == "fp8" else "auto",
    )


def llamacpp_job(args: argparse.Namespace, *, ctx: int) -> LlamaCppJob:
    gpus = getattr(args, "gpus", None) or 1
    parallel = _requests(args)
    return LlamaCppJob(ctx_size=ctx * parallel, n_parallel=parallel, n_gpus=gpus)


def _model(args: argparse.Namespace) -> str:
    """MODEL as ``memfit llama-server`` takes it: a .gguf, or a bundled NAME[:FILE_TYPE]
    (default Q4_K_M; the answer's notes say which)."""
    return str(args.model)


def cmd_fit_runtime(args: argparse.Namespace) -> int:
    """``memfit fit --runtime sglang|llama.cpp --solve …``."""
    try:
        return _fit_runtime(args)
    except NotModelledError as exc:  # not bad input: said with the nearest answers (exit 1)
        return print_not_modelled(args.runtime, args.model, _gpu(args, "fit"), str(exc),
                                  as_json=args.json)  # fmt: skip


def cmd_plan_runtime(args: argparse.Namespace, verb: str) -> int:
    """``memfit plan|upgrade --runtime sglang|llama.cpp``: see :func:`_plan_runtime`."""
    try:
        return _plan_runtime(args, verb)
    except NotModelledError as exc:
        return print_not_modelled(args.runtime, args.model, _gpu(args, verb), str(exc),
                                  as_json=args.json)  # fmt: skip


def _fit_runtime(args: argparse.Namespace) -> int:
    """``memfit fit --runtime sglang|llama.cpp --solve …``."""
    gpu = _gpu(args, "fit")
    solves = _SOLVES[args.runtime]
    solve = solves.get(args.solve)
    if solve is None:
        raise SpecError(
            f"--solve {args.solve} with --runtime {args.runtime}: solve {' or '.join(solves)}"
        )
    if args.runtime == "sglang":
        context = None if solve == "context-length" else _length(args)
        config = sglang_config(args, context=context)
        value, best = api.fit(args.model, config, gpu=gpu, solve=solve)
        s = best if best is not None else api.estimate(args.model, config, gpu=gpu)
        what = (
            "largest --context-length that starts"
            if solve == "context-length"
            else f"most requests of {_length(args):,} tokens held at once"
        )
        record = sglang_json(s, launch_command(args.model, config))
        text = render_sglang(s, args.model)
    else:
        job = llamacpp_job(args, ctx=_length(args))
        value, e = api.fit(_model(args), job, gpu=gpu, solve=solve)
        what = f"largest {'-c' if solve == 'ctx-size' else '-ngl'} that fits"
        record = llamacpp_json(e)
        text = render_llamacpp(e)
    if args.json:
        record.update({"runtime": args.runtime, "solve": solve, "max_value": value,
                       "fits": value > 0})  # fmt: skip
        print(json.dumps(record, indent=2))
    else:
        print(text)
        print(f"{args.runtime}: {what}: {value:,}" if value else
              f"{args.runtime}: nothing fits on {args.gpu}")  # fmt: skip
    return EXIT_OK if value > 0 else EXIT_DOES_NOT_FIT


def _plan_runtime(args: argparse.Namespace, verb: str) -> int:
    """``memfit plan|upgrade --runtime sglang|llama.cpp``: the server's start-up of the asked
    context on ``--gpu``, with the largest values that fit (neither server's configurations
    are searched: the answer says so)."""
    gpu = _gpu(args, verb)
    if getattr(args, "mode", "infer") != "infer":
        raise SpecError(f"--runtime {args.runtime} serves a model: pass --mode infer")
    note = (
        f"{verb} --runtime {args.runtime}: the server as asked on {args.gpu} and the largest "
        f"values that fit; {args.runtime}'s own settings are not searched (memfit plan "
        "--runtime vllm searches vLLM's)"
    )
    if args.runtime == "sglang":
        config = sglang_config(args, context=_length(args))
        s = api.estimate(args.model, config, gpu=gpu)
        unset = sglang_config(args, context=None)  # the longest context, not the asked one
        longest, _ = api.fit(args.model, unset, gpu=gpu, solve="context-length")
        held, _ = api.fit(args.model, config, gpu=gpu, solve="max-running-requests")
        want = _requests(args)
        ok = s.starts and held >= want
        if args.json:
            record = sglang_json(s, launch_command(args.model, config))
            record.update({"runtime": "sglang", "requests": want, "max_requests": held,
                           "max_context_length": longest, "fits": ok, "note": note})  # fmt: skip
            print(json.dumps(record, indent=2))
        else:
            print(render_sglang(s, args.model))
            print(f"holds {held:,} request(s) of {_length(args):,} tokens (asked {want}); "
                  f"largest --context-length that starts: {longest:,}")  # fmt: skip
            print(f"note: {note}")
        return EXIT_OK if ok else EXIT_DOES_NOT_FIT
    job = llamacpp_job(args, ctx=_length(args))
    e = api.estimate(_model(args), job, gpu=gpu)
    fits = e.verdict is not None and e.verdict.fits
    if args.json:
        record = llamacpp_json(e)
        record.update({"runtime": "llama.cpp", "fits": fits, "note": note})
        print(json.dumps(record, indent=2))
    else:
        print(render_llamacpp(e))
        print(f"note: {note}")
    return EXIT_OK if fits else EXIT_DOES_NOT_FIT


def print_not_modelled(runtime: str, model: str, gpu: GPU, reason: str, *, as_json: bool) -> int:
    """A serving question memfit does not model (``reason``), said with the nearest answers
    memfit has (``memfit vllm`` where it models the model there, its inference outside any
    server); exit 1: a valid question, not bad input."""
    vllm = _served_by_vllm(model)
    kind = runtime.replace(".", "")  # the record's kind: "sglang", "llamacpp"
    record = not_modelled_json(kind, model, gpu.name, reason, vllm=vllm)
    print(json.dumps(record, indent=2) if as_json
          else render_server_not_modelled(model, gpu.name, reason, vllm=vllm))  # fmt: skip
    return EXIT_DOES_NOT_FIT


def _served_by_vllm(model: str) -> bool:
    """Whether memfit models ``model`` under vLLM (a generative decoder it can read)."""
    try:
        served_as_decoder(api.serving_spec(model.split(":")[0]))
    except MemfitError:
        return False
    return True
