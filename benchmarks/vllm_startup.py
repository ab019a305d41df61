"""memfit vllm against published vLLM start-up logs (benchmarks/data/vllm_startup_logs.jsonl).

Each record is one published `vllm serve` start-up with its flags, vLLM version, GPU and the
figures its log printed, with the source URL. For each, memfit's prediction (with the GPU total
the log printed) is compared: weights, activation peak, non-torch, available KV cache bytes, KV
tokens, max concurrency and the verdict. Writes benchmarks/results/vllm_startup.md.

    PYTHONPATH=src python benchmarks/vllm_startup.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from memfit.hardware.catalog import get_gpu
from memfit.models import ModelSpec, resolve_model
from memfit.serving import simulate_startup
from memfit.serving.command import hub_id
from memfit.serving.cudagraphs import fa_split_workspace_bytes
from memfit.serving.startup import graph_shape
from memfit.serving.vision import served_spec
from memfit.serving.vllm_matrix import cudagraph_capture_sizes
from memfit.spec.serving import VllmConfig
from memfit.units import GiB

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "vllm_startup_logs.jsonl"
OUT = HERE / "results" / "vllm_startup.md"
_FLAG_FIELDS = {
    "tensor-parallel-size": "tensor_parallel_size",
    "pipeline-parallel-size": "pipeline_parallel_size",
    "gpu-memory-utilization": "gpu_memory_utilization",
    "max-model-len": "max_model_len",
    "max-num-seqs": "max_num_seqs",
    "max-num-batched-tokens": "max_num_batched_tokens",
    "block-size": "block_size",
    "kv-cache-dtype": "kv_cache_dtype",
    "dtype": "dtype",
    "quantization": "quantization",
}


def load() -> list[dict[str, Any]]:
    return [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line]


def spec_of(r: dict[str, Any]) -> ModelSpec:
    """The served checkpoint's config: the record's own, or the bundled one of ``arch`` (a
    multimodal checkpoint's bundled text tower wrapped as vLLM serves it, memfit.serving.vision
    ``served_spec``, as ``memfit vllm`` does)."""
    config = dict(r["config"]) if r.get("config") else dict(resolve_model(r["arch"]).config or {})
    config.update(r.get("config_overrides") or {})
    if r.get("quantization_config"):
        config["quantization_config"] = r["quantization_config"]
    spec = ModelSpec.from_config(config)
    return served_spec(spec, hub_id(r["arch"])) if r.get("arch") and not r.get("config") else spec


def predict(r: dict[str, Any]) -> Any:
    kwargs = {_FLAG_FIELDS[k]: v for k, v in r["flags"].items() if k in _FLAG_FIELDS}
    config = VllmConfig(vllm_version=r["vllm_version"], **kwargs)
    return simulate_startup(
        spec_of(r), get_gpu(r["gpu"]), config, total_bytes=int(r["total_gib"] * GiB)
    )


def _err(pred: float, meas: float | None) -> float | None:
    if meas is None or meas == 0:
        return None
    return 100.0 * (pred - meas) / abs(meas)


def compare(r: dict[str, Any]) -> dict[str, Any]:
    s = predict(r)
    m = r["measured"]
    L = s.max_model_len
    bs = s.block_size
    meas_conc = None
    if m.get("kv_tokens") is not None:
        meas_conc = m["kv_tokens"] / (-(-L // bs) * bs)
    return {
        "id": r["id"],
        "version": r["vllm_version"] + ("" if r["version_stated"] else " (assumed)"),
        "weights": (s.weights_bytes / GiB, m.get("weights_gib")),
        "activation": (s.activation_peak_bytes / GiB, m.get("activation_gib")),
        "non_torch": (s.non_torch_bytes / GiB, m.get("non_torch_gib")),
        "kv": (s.available_kv_bytes / GiB, m.get("kv_gib")),
        "tokens": (s.kv_cache_tokens, m.get("kv_tokens")),
        "concurrency": (s.max_concurrency, meas_conc),
        "starts": (s.starts, m["starts"]),
        "graph": (s.cuda_graph_bytes / GiB, m.get("graph_actual_gib")),
        "graph_est": (s.cuda_graph_estimate_bytes / GiB, m.get("graph_estimated_gib")),
        "graph_counts": m.get("graph_counts"),
        "url": r["url"],
        "graph_held_out": bool(r.get("graph_held_out")),
    }


def _cell(pair: tuple[float, float | None], fmt: str) -> str:
    pred, meas = pair
    if meas is None:
        return f"{pred:{fmt}} / –"
    e = _err(pred, meas)
    return f"{pred:{fmt}} / {meas:{fmt}} ({e:+.1f} %)" if e is not None else f"{pred:{fmt}}"


def _within(rows: list[dict[str, Any]], key: str, tol: float) -> str:
    errs = [(c["id"], _err(*c[key])) for c in rows if c[key][1] is not None]
    errs = [(i, e) for i, e in errs if e is not None]
    out = [f"{i} {e:+.1f} %" for i, e in errs if abs(e) > tol]
    return f"{key}: {len(errs) - len(out)} of {len(errs)} logged figures within {tol:g} %" + (
        f"; outside: {', '.join(out)}" if out else ""
    )


def _graph_points(key: str) -> list[tuple[tuple[float, float, float], float, float]]:
    """Per logged graph figure: memfit.serving.cudagraphs' per-graph regressors (n_graphs, n_graphs
    x layers, n_graphs x MoE layers), the figure less FlashAttention's split workspace (the
    module's mechanism 1, not fitted) and the figure, in GiB."""
    pts = []
    for r in load():
        if r["measured"].get(key) is None or not r["measured"].get("graph_counts"):
            continue
        if r.get("graph_held_out") or not r["gpu"].startswith("H100"):
            continue  # added after the fit (an out-of-sample check), or not FlashAttention 3
        tp = int(r["flags"].get("tensor-parallel-size", 1))
        pp = int(r["flags"].get("pipeline-parallel-size", 1))
        minor = int(r["vllm_version"].split(".")[1])
        layers, moe, heads, dv, fa = graph_shape(spec_of(r), tp=tp, pp=pp, minor=minor)
        n_pw, n_full = r["measured"]["graph_counts"]
        largest_full = cudagraph_capture_sizes(
            max_num_seqs=4096, max_num_batched_tokens=8192, max_capture_size=8192
        )[n_full - 1]
        ws = (
            fa_split_workspace_bytes(
                largest_full=largest_full, n_heads_per_rank=heads, head_dim_v=dv
            )
            if fa
            else 0
        )
        n = float(n_pw + n_full)
        logged = r["measured"][key]
        pts.append(((n, n * layers, n * moe), logged - ws / GiB, logged))
    return pts


def loo_graph_fit() -> list[str]:
    """Refit memfit.serving.cudagraphs' per-graph constants by least squares on the logged graph
    figures, leaving each log out in turn: the leave-one-out error of the model (workspace
    included), and the constants fitted on all logs (the ones the module carries)."""
    lines = []
    for key, name in (("graph_actual_gib", "capture"),):
        pts = _graph_points(key)
        fit_all = _lstsq(pts)
        errs = []
        for i, (x, y, logged) in enumerate(pts):
            c = _lstsq(pts[:i] + pts[i + 1 :])
            errs.append(100.0 * (sum(ci * xi for ci, xi in zip(c, x)) - y) / logged)
        errs.sort(key=abs)
        med = abs(errs[len(errs) // 2])
        lines.append(
            f"CUDA graph {name} fit on {len(pts)} logs: FlashAttention split workspace + per graph "
            f"{fit_all[0] * 1024:.4f} MiB + {fit_all[1] * 1024:.4f} MiB per layer + "
            f"{fit_all[2] * 1024:.4f} MiB per MoE layer; leave-one-out |error| median {med:.1f} %, "
            f"max {abs(errs[-1]):.1f} %, {sum(abs(e) <= 20 for e in errs)} of {len(errs)} "
            "within 20 %"
        )
    return lines


#: the step of vLLM's per-graph sample: one ``torch.cuda.mem_get_info`` difference, which moves by
#: whole 2 MiB device pages (docs/accuracy.md, "vLLM's graph estimate")
SAMPLE_STEP_MIB = 2.0


def pages_per_sampled_graph(pred_gib: float, logged_gib: float, counts: list[int]) -> float:
    """memfit's estimate less vLLM's, per graph vLLM extrapolates (``n - 1`` per mode: each mode's
    estimate is its first capture plus ``(n - 1)`` x one sampled graph), in 2 MiB pages."""
    extrapolated = sum(n - 1 for n in counts)
    return (pred_gib - logged_gib) * 1024 / extrapolated / SAMPLE_STEP_MIB


def sampling_band(rows: list[dict[str, Any]], pages: float = 1.0) -> str:
    """vLLM's estimate error expressed in its own sampling step (pages of 2 MiB per extrapolated
    graph): how many logged estimates memfit's mean lies within ``pages`` of. Descriptive, over
    every log that prints the estimate and its graph counts (34 of them carry the fitted
    constants: not a validation)."""
    res = [
        (c["id"], pages_per_sampled_graph(*c["graph_est"], c["graph_counts"]))
        for c in rows
        if c["graph_est"][1] is not None and c["graph_counts"]
    ]
    out = [f"{i} {p:+.1f}" for i, p in res if abs(p) > pages]
    return (
        f"graph_est in vLLM's sampling step (memfit - logged, 2 MiB pages per extrapolated graph):"
        f" within {pages:g} page(s) either way on {len(res) - len(out)} of {len(res)}"
        + (f"; outside: {', '.join(out)}" if out else "")
    )


def is_segment_outlier(r: dict[str, Any], mode: str) -> bool:
    """Whether a log's per-graph sample for ``mode``, extrapolated over that mode's graphs, is
    more than the whole measured capture: then it is not what a graph costs but a one-off of
    the sampled capture (a new 20 MiB allocator segment: docs/accuracy.md, "vLLM's graph
    estimate"), and it is left out of the sample fit."""
    s = r["graph_samples"][mode]
    capture = r["measured"].get("graph_actual_gib")
    return capture is not None and (s["n"] - 1) * s["per_graph_mib"] > capture * 1024


def _sample_points(mode: str) -> list[tuple[str, tuple[float, float, float], float]]:
    """Per log with vLLM's debug lines (H100, not held out): (id, (1, layers, MoE layers) of the
    rank, the logged per-graph sample in MiB) for ``mode``, segment outliers left out."""
    pts = []
    for r in load():
        g = r.get("graph_samples")
        if not g or mode not in g or r.get("graph_held_out") or not r["gpu"].startswith("H100"):
            continue
        if is_segment_outlier(r, mode):
            continue
        tp = int(r["flags"].get("tensor-parallel-size", 1))
        pp = int(r["flags"].get("pipeline-parallel-size", 1))
        minor = int(r["vllm_version"].split(".")[1])
        layers, moe, *_ = graph_shape(spec_of(r), tp=tp, pp=pp, minor=minor)
        pts.append((r["id"], (1.0, float(layers), float(moe)), g[mode]["per_graph_mib"]))
    return pts


def loo_sample_fit() -> list[str]:
    """Refit memfit.serving.cudagraphs' ESTIMATE_SAMPLE_* (MiB per graph) on the logged samples,
    and each sample's leave-one-out error in MiB (vLLM's samples move by 2 MiB pages)."""
    lines = []
    for mode in ("PIECEWISE", "FULL"):
        pts = [(x, y, y) for _, x, y in _sample_points(mode)]
        c = _lstsq(pts)
        errs = []
        for i, (x, y, _) in enumerate(pts):
            ci = _lstsq(pts[:i] + pts[i + 1 :])
            errs.append(sum(a * b for a, b in zip(ci, x)) - y)
        errs.sort(key=abs)
        lines.append(
            f"vLLM {mode} per-graph sample fit on {len(pts)} logs: {c[0]:.4f} MiB + {c[1]:.4f} MiB "
            f"per layer + {c[2]:.4f} MiB per MoE layer; leave-one-out |error| median "
            f"{abs(errs[len(errs) // 2]):.1f} MiB, max {abs(errs[-1]):.1f} MiB, "
            f"{sum(abs(e) <= 2.0 for e in errs)} of {len(errs)} within one 2 MiB page"
        )
    out = [
        f"{r['id']} {m} {r['graph_samples'][m]['per_graph_mib']:g} MiB"
        for r in load()
        if r.get("graph_samples")
        for m in ("PIECEWISE", "FULL")
        if m in r["graph_samples"] and is_segment_outlier(r, m)
    ]
    lines.append("per-graph samples left out (segment outliers): " + (", ".join(out) or "none"))
    return lines


def piecewise_first_fit() -> str:
    """Refit memfit.serving.cudagraphs.ESTIMATE_PIECEWISE_FIRST: the PIECEWISE mode's logged
    first capture (MiB) against the largest graph's MLP input projection output (MiB: ``largest
    x 2 x intermediate / TP x activation bytes``), least squares over the fitted logs."""
    xs, ys = [], []
    for r in load():
        g = r.get("graph_samples")
        if not g or "PIECEWISE" not in g or r.get("graph_held_out"):
            continue
        if not r["gpu"].startswith("H100"):
            continue
        tp = int(r["flags"].get("tensor-parallel-size", 1))
        text = spec_of(r).text or spec_of(r)
        inter = text.intermediate_size or 0
        if text.n_experts and text.expert_intermediate_size:
            inter = (text.n_experts_per_token or 1) * text.expert_intermediate_size
        act = 4 if r["flags"].get("dtype") == "float32" else 2
        largest = cudagraph_capture_sizes(max_num_seqs=1024, max_num_batched_tokens=8192)[-1]
        xs.append(largest * 2 * inter / tp * act / 2**20)
        ys.append(g["PIECEWISE"]["first_mib"])
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    base = my - slope * mx
    res = [y - (base + slope * x) for x, y in zip(xs, ys)]
    return (
        f"vLLM PIECEWISE first capture fit on {n} logs: {base:.2f} MiB + {slope:.4f} x the largest "
        f"graph's MLP input projection output; residuals {min(res):+.0f} to {max(res):+.0f} MiB"
    )


def _held_out(rows: list[dict[str, Any]]) -> str:
    """The logged graph figures of the records added after the fit (``graph_held_out``)."""
    out = []
    for c in rows:
        if not c["graph_held_out"]:
            continue
        for key, name in (("graph", "capture"), ("graph_est", "estimate")):
            e = _err(*c[key])
            if e is not None:
                out.append(f"{c['id']} {name} {e:+.1f} %")
    return "CUDA graphs held out of the fit: " + (", ".join(out) or "none")


def _lstsq(
    pts: list[tuple[tuple[float, float, float], float, float]],
) -> tuple[float, float, float]:
    """Least squares y = c . x for three unknowns (normal equations, Cramer's rule)."""
    a = [[sum(p[0][i] * p[0][j] for p in pts) for j in range(3)] for i in range(3)]
    b = [sum(p[0][i] * p[1] for p in pts) for i in range(3)]

    def det(m: list[list[float]]) -> float:
        return (
            m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
        )

    d = det(a)
    out = []
    for k in range(3):
        m = [row[:] for row in a]
        for i in range(3):
            m[i][k] = b[i]
        out.append(det(m) / d)
    return out[0], out[1], out[2]


def main() -> int:
    rows = [compare(r) for r in load()]
    head = (
        "| id | vLLM | weights GiB | activation GiB | non-torch GiB | KV cache GiB | KV tokens | "
        "max concurrency | CUDA graphs GiB (capture) | graph estimate GiB | starts (pred / log) |"
        "\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    worst: dict[str, tuple[float, str]] = {}
    wrong_starts = []
    wrong_fails: list[str] = []
    for c in rows:
        for key in ("weights", "kv", "tokens", "concurrency", "graph", "graph_est"):
            pred, meas = c[key]
            e = _err(pred, meas)
            started = c["starts"][1] is not False
            if e is not None and started and abs(e) > abs(worst.get(key, (0.0, ""))[0]):
                worst[key] = (e, c["id"])
        if c["starts"][0] and c["starts"][1] is False:  # None: the log gives no verdict
            wrong_starts.append(c["id"])
        if c["starts"][0] is False and c["starts"][1] is True:
            wrong_fails.append(c["id"])
        lines.append(
            f"| [{c['id']}]({c['url']}) | {c['version']} | {_cell(c['weights'], '.2f')} | "
            f"{_cell(c['activation'], '.2f')} | {_cell(c['non_torch'], '.2f')} | "
            f"{_cell(c['kv'], '.2f')} | {_cell(c['tokens'], ',.0f')} | "
            f"{_cell(c['concurrency'], '.2f')} | {_cell(c['graph'], '.2f')} | "
            f"{_cell(c['graph_est'], '.2f')} | {c['starts'][0]} / {c['starts'][1]} |"
        )
    over_tokens = [
        c["id"]
        for c in rows
        if c["tokens"][1] and (_err(*c["tokens"]) or 0) > 3.0 and c["starts"][1] is not False
    ]
    summary = [
        _within(rows, "weights", 1.0),
        _within(rows, "tokens", 3.0),
        _within(rows, "graph", 20.0),
        _within(rows, "graph_est", 20.0),
        sampling_band(rows),
        "more KV tokens than logged by > 3 %: " + (", ".join(over_tokens) or "none"),
        *loo_graph_fit(),
        *loo_sample_fit(),
        piecewise_first_fit(),
        _held_out(rows),
        f"{len(rows)} published start-ups; worst errors (setups that started): "
        + ", ".join(f"{k} {e:+.1f} % ({i})" for k, (e, i) in worst.items()),
        "predicted 'starts' for a setup that failed: "
        + (", ".join(wrong_starts) if wrong_starts else "none"),
        "predicted a failure for a setup that started: "
        + (", ".join(wrong_fails) if wrong_fails else "none"),
    ]
    text = "\n".join(["# memfit vllm vs published vLLM start-up logs", "", *lines, "", *summary])
    OUT.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 1 if wrong_starts else 0


if __name__ == "__main__":
    sys.exit(main())
