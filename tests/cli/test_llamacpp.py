"""`memfit llama-server`: llama.cpp's buffer lines, the verdict as an exit code, JSON, pasted
llama-server flags, a GGUF header as MODEL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.cli import main

HEADER = Path(__file__).parents[1] / "fixtures" / "gguf" / "llama-3.2-1b-Q4_K_M.header.gguf"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_fitting_server_prints_llama_cpp_lines_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, _ = run(capsys, "llama-server", "llama-3.1-8b:Q4_K_M", "--gpu", "RTX-3060",
                     "-c", "8192")  # fmt: skip
    assert rc == 0
    assert "load_tensors:     CUDA0 model buffer size =    4403.49 MiB" in out
    assert "llama_kv_cache:     CUDA0 KV buffer size =    1024.00 MiB" in out
    assert "FITS on RTX-3060" in out and "largest -c that fits at -ngl 33:" in out


def test_a_model_too_large_exits_1_with_the_largest_ngl(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "llamacpp", "llama-3.1-70b:Q4_K_M", "--gpu", "RTX-4090",
                     "-c", "8192", "-ngl", "99")  # fmt: skip
    assert rc == 1 and "DOES NOT FIT on RTX-4090" in out
    largest = int(out.split("largest -ngl that fits at -c 8192: ")[1].split()[0])
    rc, out, _ = run(capsys, "llama-server", "llama-3.1-70b:Q4_K_M", "--gpu", "RTX-4090",
                     "-c", "8192", "-ngl", str(largest))  # fmt: skip
    assert rc == 0 and f"offloaded {largest}/81 layers to GPU" in out


def test_a_pasted_llama_server_line_parses(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "llama-server", "-m", "qwen2.5-7b:Q4_K_M", "--gpu", "RTX-4090",
                     "--host", "0.0.0.0", "--port", "8080", "-t", "8", "--jinja", "-ngl", "99",
                     "-fa", "-ctk", "q8_0", "-ctv", "q8_0", "-c", "32768", "-np", "2",
                     "--json")  # fmt: skip
    record = json.loads(out)
    assert rc == 0 and record["cache_type_k"] == "q8_0" and record["flash_attn"] is True
    assert record["n_seq"] == 2 and record["n_ctx"] == 32768
    assert record["command"].startswith("llama-server -m qwen2.5-7b:Q4_K_M -ngl 99 -c 32768")


def test_json_reads_as_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "llama-server", "llama-3.2-1b", "--gpu", "L4", "--json")
    r = json.loads(out)
    assert rc == 0 and r["kind"] == "llamacpp" and r["verdict"]["verdict"] == "fits"
    assert r["device_used_bytes"] == r["devices"][0]["total_bytes"]
    assert r["largest_n_gpu_layers"] == 17 and r["largest_ctx_size"] == 131072


def test_a_gguf_header_is_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "llama-server", str(HEADER), "--gpu", "RTX-3060", "-c", "4096")
    assert rc == 0 and "CUDA0 model buffer size =     762.81 MiB" in out
    assert "GGUF header" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-fa", "off", "-ctv", "q4_0"], "-ctv q4_0 with -fa off"),
        (["-ctk", "q3_k"], "-ctk ('q3_k') must be one of"),
        (["-ts", "3,x"], "-ts ('3,x') must be comma-separated shares"),
        (["--gpus", "2", "-ts", "1,1,1"], "-ts has 3 shares for --gpus 2"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    rc, _, err = run(capsys, "llama-server", "llama-3.2-1b", "--gpu", "L4", *argv)
    assert rc == 2 and message in err and "Traceback" not in err


def test_a_missing_gguf_and_an_unknown_file_type_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "llama-server", "missing.gguf", "--gpu", "L4")
    assert rc == 2 and "does not exist" in err
    rc, _, err = run(capsys, "llama-server", "llama-3.2-1b:Q4_K_M", "-m", "other", "--gpu", "L4")
    assert rc == 2 and "give MODEL once" in err
