"""memfit's inference estimate and hf-mem's, side by side, as whole cold processes (issue 32).

`hf-mem <https://github.com/alvarobartt/hf-mem>`_ (0.5.6, installed in its own virtual
environment, ``/work/venv-hfmem`` by default) estimates inference memory from a Hugging Face Hub
repository's safetensors headers, read over HTTP; this machine has no route to the hub. What
0.5.6 requests, read from its source (``hf_mem/run.py``, ``hf_mem/safetensors/fetch.py``,
``hf_mem/_fetch.py``):

1. ``GET https://huggingface.co/api/models/{id}/tree/{rev}?recursive=true``: the file list;
2. ``GET https://huggingface.co/{id}/resolve/{rev}/model.safetensors.index.json`` when the repo is
   sharded, then for each shard (concurrently, at most ``MAX_WORKERS`` at once) ``GET .../{shard}``
   with ``Range: bytes=0-100000`` (a second ranged GET if the header is longer); a single
   ``model.safetensors`` is read the same way;
3. with ``--experimental`` (its KV-cache estimate): ``GET .../resolve/{rev}/config.json``.

Every URL is the literal ``https://huggingface.co`` (no ``HF_ENDPOINT`` nor any base-URL
setting; only ``HF_TOKEN`` / ``HF_HOME`` for the token, ``REQUEST_TIMEOUT`` and ``MAX_WORKERS``
are read), so it cannot be pointed at a local endpoint without a patch. This benchmark patches
it at the HTTP layer only, from outside its code: the hf-mem process gets a ``sitecustomize.py``
(written to a temporary folder put on its ``PYTHONPATH``) that wraps ``httpx2.AsyncClient``'s
transport so that a request to ``huggingface.co`` goes to ``http://127.0.0.1:PORT`` instead,
same path and headers (its own transport otherwise: same connection limits; HTTP/1.1 since the
local server speaks plain HTTP). Nothing else in hf-mem is touched: its parsing, its arithmetic
and its output are its own.

The local hub (``http.server`` on 127.0.0.1, in this process) answers those endpoints for a few
bundled models: the config is memfit's bundled ``config.json`` (the hub's, source in
``src/memfit/models/configs/index.json``); the safetensors headers are GENERATED: the model built
by transformers from that config on the meta device, cast to the config's ``torch_dtype``, its
``state_dict`` (tied weights once, as ``save_pretrained`` writes them) as tensor names, dtypes,
shapes and computed data offsets, split into shards of at most 5 GB in ``state_dict`` order
(``save_pretrained``'s ``max_shard_size="5GB"``: the hub's split may differ in where it cuts;
hf-mem sums every shard, so the bytes do not depend on the split). No weights exist: a ranged GET
past the header returns zeros.

What this leaves out of hf-mem's real cost: the network (the hub's round trips: the file list,
the index, the shards' headers, the config, plus the redirect of each ``resolve`` to the CDN)
and TLS. So hf-mem's times here are a lower bound of what it takes against the hub.

Timed, each as a new process, ``--repeat`` times, in turns (hf-mem, memfit analytic, memfit's
default engine, then again) after one untimed warm-up turn (files in the page cache; memfit's
modules compiled to bytecode once, as an installed package has them: hf-mem's venv has its
bytecode from pip): wall seconds, the child's CPU seconds and peak RSS (``wait4``); the median
of each. memfit runs with a fresh, empty answers cache each time (``MEMFIT_CACHE_DIR``).
The job: inference of the model in its checkpoint dtype, ``--batch B`` sequences of ``--seq S``
tokens: hf-mem ``--experimental --max-model-len S --batch-size B`` (KV-cache dtype ``auto``: the
config's ``torch_dtype``), memfit ``estimate NAME --mode infer --seq S --batch B`` (weights in
bf16, ``bf16-true``, the infer default; KV cache in the weights' dtype).

    PYTHONPATH=src .venv/bin/python benchmarks/hfmem_side_by_side.py            # writes results
    PYTHONPATH=src .venv/bin/python benchmarks/hfmem_side_by_side.py --repeat 3 --models qwen3-8b
    # before/after on one machine: hf-mem and the analytic engine only, another commit's tree
    git archive BASE src | tar -x -C /tmp/base
    PYTHONPATH=src .venv/bin/python benchmarks/hfmem_side_by_side.py \
        --tools "hf-mem,memfit analytic" --memfit-src /tmp/base/src --out /tmp/before
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
HFMEM_VENV = Path(os.environ.get("HFMEM_VENV", "/work/venv-hfmem"))
#: bf16 checkpoints (the hub's torch_dtype bfloat16), one single-file, three sharded
MODELS = ("llama-3.2-1b", "llama-3.1-8b", "qwen3-8b", "mistral-7b-v0.1")
#: transformers' save_pretrained(max_shard_size="5GB"): 5 * 10**9 bytes per shard at most
SHARD_BYTES = 5 * 10**9
#: safetensors' dtype names (https://github.com/huggingface/safetensors, "Format": dtype)
ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
ST_BYTES = {"BF16": 2, "F16": 2, "F32": 4}

#: The hf-mem process's sitecustomize: its httpx2 client sends huggingface.co requests here.
SITECUSTOMIZE = '''\
"""hfmem_side_by_side.py: hf-mem's requests to huggingface.co go to the local hub (HTTP only)."""
import os

_BASE = os.environ.get("HFMEM_LOCAL_HUB")
if _BASE:
    import httpx2

    _host, _port = _BASE.split("//", 1)[1].split(":")

    class _ToLocalHub(httpx2.AsyncBaseTransport):
        def __init__(self, inner):
            self._inner = inner

        async def handle_async_request(self, request):
            if request.url.host == "huggingface.co":
                request.url = request.url.copy_with(scheme="http", host=_host, port=int(_port))
            return await self._inner.handle_async_request(request)

        async def aclose(self):
            await self._inner.aclose()

    _init = httpx2.AsyncClient.__init__

    def _patched_init(self, *args, **kwargs):
        limits = kwargs.get("limits", httpx2.Limits(max_connections=100))
        inner = httpx2.AsyncHTTPTransport(limits=limits, trust_env=False)
        kwargs.setdefault("transport", _ToLocalHub(inner))
        _init(self, *args, **kwargs)

    httpx2.AsyncClient.__init__ = _patched_init
'''


# -- the repository each model would be on the hub ----------------------------------------------
def state_dict_layout(config: dict[str, Any]) -> list[tuple[str, str, list[int]]]:
    """(name, safetensors dtype, shape) of each tensor ``save_pretrained`` writes for
    ``config``'s model: built by transformers on the meta device in the config's dtype, tied
    weights once (the first name kept, as transformers drops the tied copies)."""
    import torch
    import transformers

    cfg = {k: v for k, v in config.items() if k not in ("architectures", "transformers_version")}
    conf = transformers.AutoConfig.for_model(**cfg)
    cls = getattr(transformers, config["architectures"][0])
    dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
    with torch.device("meta"):
        model = cls(conf).to(getattr(torch, dtype))
    seen: set[int] = set()
    out = []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        out.append((name, ST_DTYPES[str(t.dtype).removeprefix("torch.")], list(t.shape)))
    return out


def safetensors_prefix(tensors: list[tuple[str, str, list[int]]]) -> tuple[bytes, int]:
    """A safetensors file's first bytes (8-byte little-endian header length, the JSON header
    padded with spaces to 8 bytes) and the whole file's size, its data never written."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dt, shape in tensors:
        n = ST_BYTES[dt]
        for d in shape:
            n *= d
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, 8 + len(text) + offset


def repository(name: str) -> tuple[str, dict[str, bytes], dict[str, tuple[bytes, int]]]:
    """(hub id, small files by path, safetensors files by path: (prefix, size)) of ``name``."""
    from memfit.models.bundled import find_bundled

    bundled = find_bundled(name)
    if bundled is None:
        raise SystemExit(f"{name!r} is not a bundled model (memfit models lists them)")
    config_text = bundled.config_path.read_bytes()
    tensors = state_dict_layout(json.loads(config_text))
    shards: list[list[tuple[str, str, list[int]]]] = [[]]
    size = 0
    for t in tensors:
        n = ST_BYTES[t[1]]
        for d in t[2]:
            n *= d
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += n
    small = {"config.json": config_text}
    st: dict[str, tuple[bytes, int]] = {}
    if len(shards) == 1:
        st["model.safetensors"] = safetensors_prefix(shards[0])
    else:
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            st[fname] = safetensors_prefix(shard)
            weight_map.update({t[0]: fname for t in shard})
        total = sum(s for _, s in st.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        small["model.safetensors.index.json"] = json.dumps(index).encode()
    return bundled.hf_id, small, st


def write_repositories(names: list[str], folder: Path) -> None:
    """Each model's repository (:func:`repository`) under ``folder``: one JSON file each."""
    for i, name in enumerate(names):
        hf_id, small, st = repository(name)
        data = {
            "name": name,
            "hf_id": hf_id,
            "small": {p: b.decode() for p, b in small.items()},
            "safetensors": {p: [base64.b64encode(pre).decode(), n] for p, (pre, n) in st.items()},
        }
        (folder / f"{i}.json").write_text(json.dumps(data))


def read_repositories(folder: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """({model name: hub id}, {hub id: (small files, safetensors prefixes and sizes)})."""
    ids, repos = {}, {}
    for path in sorted(folder.glob("*.json")):
        d = json.loads(path.read_text())
        ids[d["name"]] = d["hf_id"]
        small = {p: t.encode() for p, t in d["small"].items()}
        st = {p: (base64.b64decode(pre), int(n)) for p, (pre, n) in d["safetensors"].items()}
        repos[d["hf_id"]] = (small, st)
    return ids, repos


# -- the local hub ------------------------------------------------------------------------------
class LocalHub:
    """The hub endpoints hf-mem 0.5.6 requests, for the repositories given; counts requests."""

    def __init__(self, repos: dict[str, tuple[dict[str, bytes], dict[str, tuple[bytes, int]]]]):
        self.repos = repos
        self.n_requests = 0
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                hub.n_requests += 1
                status, headers, body = hub.answer(self.path, self.headers.get("Range"))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, rng: str | None) -> tuple[int, dict[str, str], bytes]:
        path = path.split("?", 1)[0]
        if m := re.fullmatch(r"/api/models/(.+)/tree/[^/]+", path):
            repo = self.repos.get(m.group(1))
            if repo is None:
                return 404, {}, b"{}"
            small, st = repo
            files = [{"type": "file", "path": p, "size": len(b)} for p, b in small.items()]
            files += [{"type": "file", "path": p, "size": s} for p, (_, s) in st.items()]
            return 200, {"Content-Type": "application/json"}, json.dumps(files).encode()
        m = re.fullmatch(r"/(.+?/.+?)/resolve/[^/]+/(.+)", path)
        if m is None or m.group(1) not in self.repos:
            return 404, {}, b""
        small, st = self.repos[m.group(1)]
        if m.group(2) in small:
            return 200, {"Content-Type": "application/json"}, small[m.group(2)]
        if m.group(2) not in st or rng is None:
            return 404 if m.group(2) not in st else 416, {}, b""  # no weights to send whole
        prefix, size = st[m.group(2)]
        a, _, b = rng.removeprefix("bytes=").partition("-")
        start, end = int(a), min(int(b) if b else size - 1, size - 1)
        body = prefix[start : end + 1]
        body += b"\0" * (end + 1 - start - len(body))  # the data: zeros, never stored
        return 206, {"Content-Range": f"bytes {start}-{end}/{size}"}, body


# -- the timed processes ------------------------------------------------------------------------
def run_process(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out_f, stderr=err_f, text=True, env=env, cwd=ROOT)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - started
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    rc = os.waitstatus_to_exitcode(status)
    return {"wall_s": wall_s, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mib": usage.ru_maxrss / 1024, "rc": rc, "out": out, "err": err[-400:]}  # fmt: skip


def tools(
    name: str, hf_id: str, seq: int, batch: int, only: str | None = None
) -> dict[str, list[str]]:
    memfit = [sys.executable, "-m", "memfit", "estimate", name, "--mode", "infer",
              "--seq", str(seq), "--batch", str(batch), "--json"]  # fmt: skip
    hfmem = [str(HFMEM_VENV / "bin" / "hf-mem"), "--model-id", hf_id, "--experimental",
             "--max-model-len", str(seq), "--batch-size", str(batch), "--json-output"]  # fmt: skip
    every = {"hf-mem": hfmem, "memfit analytic": [*memfit, "--engine", "analytic"],
             "memfit default": memfit}  # fmt: skip
    return every if only is None else {k: v for k, v in every.items() if k in only.split(",")}


def measure(name: str, hf_id: str, hub: LocalHub, shim: Path, args: Any) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {}
    answers: dict[str, Any] = {}
    load = [os.getloadavg()[0]]
    for turn in range(args.repeat + 1):  # turn 0: a warm-up, not counted
        for tool, argv in tools(name, hf_id, args.seq, args.batch, args.tools).items():
            # memfit's modules compiled once and read back as bytecode, as from an installed
            # package (hf-mem's venv has its bytecode from pip; PYTHONDONTWRITEBYTECODE here
            # would make every memfit process compile its ~250 modules from source again),
            # kept under a folder of this run's (PYTHONPYCACHEPREFIX) so that the checkout's
            # src/ stays without bytecode for benchmarks/cold_commands.py
            drop = ("MEMFIT_NO_CACHE", "PYTHONDONTWRITEBYTECODE")
            env = {k: v for k, v in os.environ.items() if k not in drop}
            if tool == "hf-mem":
                env.update(PYTHONPATH=str(shim), HFMEM_LOCAL_HUB=hub.url, HF_HOME=str(shim))
                env.pop("HF_TOKEN", None)
            else:
                env.update(PYTHONPATH=str(args.memfit_src), PYTHONPYCACHEPREFIX=str(shim / "pyc"))
            with tempfile.TemporaryDirectory(prefix="memfit-hfmem-") as cache_dir:
                env["MEMFIT_CACHE_DIR"] = cache_dir
                before = hub.n_requests
                r = run_process(argv, env)
                r["n_requests"] = hub.n_requests - before
            if r["rc"] != 0:
                raise SystemExit(f"{tool} on {name} exited {r['rc']}: {r['err']}")
            answers[tool] = json.loads(r.pop("out"))
            if turn:
                runs.setdefault(tool, []).append(r)
            load.append(os.getloadavg()[0])
    return {"model": name, "hf_id": hf_id, "runs": runs, "answers": answers,
            "load": [min(load), max(load)]}  # fmt: skip


def med(runs: list[dict[str, Any]], k: str) -> float:
    return float(statistics.median(r[k] for r in runs))


def byte_row(row: dict[str, Any]) -> dict[str, Any]:
    h, m = row["answers"]["hf-mem"], row["answers"]["memfit analytic"]
    d = row["answers"]["memfit default"]
    return {
        "hf-mem weights": h["memory"],
        "hf-mem kv_cache": h["kv_cache"],
        "hf-mem total": h["total_memory"],
        "memfit parameters": m["components"]["parameters"],
        "memfit kv_cache": m["components"]["kv_cache"],
        "memfit allocated": m["peak_allocated_bytes"],
        "memfit reserved": m["peak_reserved_bytes"],
        "memfit device": m["device_used_bytes"],
        "default engine": d["engine"],
        "default device": d["device_used_bytes"],
    }


def gib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**30:.2f}"


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        "# hf-mem and memfit side by side: whole cold processes, the same inference job",
        "",
        f"Written by `benchmarks/hfmem_side_by_side.py {' '.join(meta['argv'])}` at commit "
        f"{meta['commit']}, {meta['written']}; python {meta['python']}, {meta['cpus']} CPUs "
        f"shared with other work; hf-mem {meta['hfmem_version']} in its own venv, reading "
        "safetensors headers generated from memfit's bundled configs off a local HTTP hub "
        "(127.0.0.1: no network, no TLS — a lower bound of its cost against the real hub; the "
        "script's docstring says how it is pointed there). Job: inference, batch "
        f"{meta['batch']}, {meta['seq']} tokens (hf-mem `--experimental --max-model-len "
        f"{meta['seq']} --batch-size {meta['batch']}`; memfit `estimate NAME --mode infer "
        f"--seq {meta['seq']} --batch {meta['batch']}`, a fresh answers cache each run). "
        f"Each tool {meta['repeat']} times per model, in turns, after an untimed warm-up turn "
        "(memfit's modules read as bytecode, as installed); medians. CPU s: the process's "
        "user + system time (less sensitive to the other work on the machine than wall s).",
        "",
        "| model (hub id) | tool | wall s (median) | CPU s | RSS MiB | HTTP requests | load avg |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for tool, runs in row["runs"].items():
            lines.append(
                f"| {row['model']} (`{row['hf_id']}`) | {tool} | {med(runs, 'wall_s'):.2f} | "
                f"{med(runs, 'cpu_s'):.2f} | {med(runs, 'rss_mib'):.0f} | "
                f"{runs[0]['n_requests']} | {row['load'][0]:.1f}-{row['load'][1]:.1f} |"
            )
    if any(len(row["answers"]) < 3 for row in rows):  # --tools: a subset ran, no bytes compared
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "What each answers (GiB): hf-mem counts the weight tensors as stored (the sum of every "
        "tensor's elements times its dtype's bytes, from the headers) and, with "
        "`--experimental`, the KV cache (2 × layers × tokens × KV heads × head dim × dtype bytes "
        "× batch); its total is their sum. memfit counts what the GPU holds at the peak: the "
        "weights as loaded, the KV cache, the prefill's activations and logits, the caching "
        "allocator's reserved bytes and the CUDA context (`device`).",
        "",
        "| model | hf-mem weights | memfit parameters | hf-mem KV | memfit KV | hf-mem total | "
        "memfit allocated | memfit reserved | memfit device | default engine (device) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        b = byte_row(row)
        lines.append(
            f"| {row['model']} | {gib(b['hf-mem weights'])} | {gib(b['memfit parameters'])} | "
            f"{gib(b['hf-mem kv_cache'])} | {gib(b['memfit kv_cache'])} | "
            f"{gib(b['hf-mem total'])} | {gib(b['memfit allocated'])} | "
            f"{gib(b['memfit reserved'])} | {gib(b['memfit device'])} | "
            f"{b['default engine']} ({gib(b['default device'])}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS / "hfmem_side_by_side")
    p.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    p.add_argument(
        "--tools",
        default=None,
        help="a comma-separated subset of: hf-mem,memfit analytic,memfit default (default all; "
        "the results tables need all three)",
    )
    p.add_argument(
        "--memfit-src",
        type=Path,
        default=ROOT / "src",
        help="the memfit source tree the memfit processes run (default this checkout's src/; "
        "another commit's, exported with `git archive`, for a before/after on one machine)",
    )
    args = p.parse_args(argv)
    if not (HFMEM_VENV / "bin" / "hf-mem").exists():
        raise SystemExit(f"hf-mem is not installed in {HFMEM_VENV} (set HFMEM_VENV)")
    names = args.models.split(",")
    if args.generate:  # the child that builds the models (torch stays out of the timer's RSS)
        write_repositories(names, args.generate)
        return 0
    with tempfile.TemporaryDirectory(prefix="hfmem-hub-") as hub_dir:
        cmd = [sys.executable, __file__, "--generate", hub_dir, "--models", args.models]
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        hub_ids, repos = read_repositories(Path(hub_dir))
    hub = LocalHub(repos)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hfmem-shim-") as shim:
        (Path(shim) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        for name in names:
            row = measure(name, hub_ids[name], hub, Path(shim), args)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "answers"}), flush=True)
    version = subprocess.run([str(HFMEM_VENV / "bin" / "python"), "-c",
                              "import hf_mem; print(hf_mem.__version__)"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    meta = {
        "written": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        "argv": sys.argv[1:] if argv is None else argv,
        "hfmem_version": version,
        "seq": args.seq,
        "batch": args.batch,
        "repeat": args.repeat,
    }  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(render(meta, rows))
    print(f"wrote {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
