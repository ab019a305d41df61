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
    config = dict(r["config"]) if r.get("config") else dict(resolve_model(r["arch"]).config or {})
    config.update(r.get("config_overrides") or {})
    if r.get("quantization_config"):
        config["quantization_config"] = r["quantization_config"]
    return ModelSpec.from_config(config)


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
        "url": r["url"],
    }


def _cell(pair: tuple[float, float | None], fmt: str) -> str:
    pred, meas = pair
    if meas is None:
        return f"{pred:{fmt}} / –"
    e = _err(pred, meas)
    return f"{pred:{fmt}} / {meas:{fmt}} ({e:+.1f} %)" if e is not None else f"{pred:{fmt}}"


def main() -> int:
    rows = [compare(r) for r in load()]
    head = (
        "| id | vLLM | weights GiB | activation GiB | non-torch GiB | KV cache GiB | KV tokens | "
        "max concurrency | starts (pred / log) |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    worst: dict[str, tuple[float, str]] = {}
    wrong_starts = []
    for c in rows:
        for key in ("weights", "kv", "tokens", "concurrency"):
            pred, meas = c[key]
            e = _err(pred, meas)
            started = c["starts"][1] is not False
            if e is not None and started and abs(e) > abs(worst.get(key, (0.0, ""))[0]):
                worst[key] = (e, c["id"])
        if c["starts"][0] and c["starts"][1] is False:  # None: the log gives no verdict
            wrong_starts.append(c["id"])
        lines.append(
            f"| [{c['id']}]({c['url']}) | {c['version']} | {_cell(c['weights'], '.2f')} | "
            f"{_cell(c['activation'], '.2f')} | {_cell(c['non_torch'], '.2f')} | "
            f"{_cell(c['kv'], '.2f')} | {_cell(c['tokens'], ',.0f')} | "
            f"{_cell(c['concurrency'], '.2f')} | {c['starts'][0]} / {c['starts'][1]} |"
        )
    summary = [
        f"{len(rows)} published start-ups; worst errors (setups that started): "
        + ", ".join(f"{k} {e:+.1f} % ({i})" for k, (e, i) in worst.items()),
        "predicted 'starts' for a setup that failed: "
        + (", ".join(wrong_starts) if wrong_starts else "none"),
    ]
    text = "\n".join(["# memfit vllm vs published vLLM start-up logs", "", *lines, "", *summary])
    OUT.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 1 if wrong_starts else 0


if __name__ == "__main__":
    sys.exit(main())
