"""The JSON API answers what the CLI's --json prints for the same flags, and refuses what a web
caller may not ask (tests against a real server on a loopback port)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests.web.conftest import cli_error, cli_json, without_timings


def get(url: str) -> tuple[int, Any, Any]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, json.loads(exc.read())


def test_api_estimate_is_the_cli_json_of_the_same_flags(server: str) -> None:
    query = "model=gpt2&engine=analytic&batch=2&seq=256&precision=amp-bf16&gpu=T4"
    status, headers, body = get(f"{server}/api/estimate?{query}")
    code, expected = cli_json(
        "estimate", "gpt2", "--engine", "analytic", "--batch", "2", "--seq", "256",
        "--precision", "amp-bf16", "--gpu", "T4",
    )  # fmt: skip
    assert status == 200 and headers["X-Memfit-Exit"] == str(code) == "0"
    assert without_timings(body) == without_timings(expected)
    assert headers["X-Memfit-Command"] == (
        "memfit estimate gpt2 --engine analytic --batch 2 --seq 256 --precision amp-bf16 --gpu T4"
    )


def test_api_default_engine_is_the_clis_default_engine(server: str) -> None:
    """No ``engine=``: the CLI's own policy (memfit.estimate.policy), in the same words. A
    LoRA job of a family the fast-path grid validates, far from the capacity: the analytic
    engine answers, unconfirmed, as ``memfit estimate`` does; nothing traces."""
    query = "model=llama-3.2-1b&batch=2&seq=512&lora-rank=16&gpu=A100-80GB"  # bf16-true
    status, headers, body = get(f"{server}/api/estimate?{query}")
    code, expected = cli_json(
        "estimate", "llama-3.2-1b", "--batch", "2", "--seq", "512", "--lora-rank", "16",
        "--gpu", "A100-80GB",
    )  # fmt: skip
    assert status == 200 and headers["X-Memfit-Exit"] == str(code) == "0"
    assert body["engine"] == expected["engine"] == "analytic"
    assert body["confirmed"] is expected["confirmed"] is False
    assert body["engine_reason"] == expected["engine_reason"]
    assert without_timings(body) == without_timings(expected)


def test_api_does_not_fit_is_an_answer_with_exit_1(server: str) -> None:
    status, headers, body = get(
        f"{server}/api/estimate?model=llama-3.1-8b&engine=analytic&precision=bf16&gpu=T4"
    )
    assert status == 200 and headers["X-Memfit-Exit"] == "1"
    assert body["fits"]["fits"] is False


def test_api_plan_is_the_cli_json(server: str) -> None:
    status, _, body = get(f"{server}/api/plan?model=gpt2&gpu=T4&seq=256&confirm=none")
    _, expected = cli_json("plan", "gpt2", "--gpu", "T4", "--seq", "256", "--confirm", "none")
    assert status == 200 and without_timings(body) == without_timings(expected)


def test_api_plan_carries_the_job_fields_it_searches_itself(server: str) -> None:
    """issue 29: the page's plan request dropped quant and checkpointing unsaid."""
    query = "model=llama-3.1-8b&gpu=RTX-4090&seq=2048&lora-rank=16&quant=nf4&checkpointing=full"
    status, headers, body = get(f"{server}/api/plan?{query}&confirm=none&engine=analytic")
    _, expected = cli_json(
        "plan", "llama-3.1-8b", "--gpu", "RTX-4090", "--seq", "2048", "--lora-rank", "16",
        "--quant", "nf4", "--confirm", "none", "--engine", "analytic",
    )  # fmt: skip
    assert status == 200 and without_timings(body) == without_timings(expected)
    assert headers["X-Memfit-Not-Taken"] == "checkpointing=full"
    _, plain, _ = get(f"{server}/api/plan?model=gpt2&gpu=T4&seq=256&confirm=none")
    assert plain["X-Memfit-Not-Taken"] is None


@pytest.mark.slow  # fit confirms its answer by tracing (a minute on a loaded 2-core machine)
def test_api_fit_is_the_cli_json(server: str, tmp_path: Path) -> None:
    from tests.conftest import TINY_GPT2

    (tmp_path / "config.json").write_text(json.dumps(TINY_GPT2))
    flags = {"gpu-memory": "2GB", "solve": "batch", "seq": "128", "precision": "bf16"}
    status, _, body = get(
        f"{server}/api/fit?" + urllib.parse.urlencode({"model": str(tmp_path), **flags})
    )
    argv = [w for k, v in flags.items() for w in (f"--{k}", v)]
    _, expected = cli_json("fit", str(tmp_path), *argv)
    assert status == 200, body
    assert without_timings(body) == without_timings(expected)


def test_api_fit_bad_input_is_the_cli_message(server: str) -> None:
    status, _, body = get(f"{server}/api/fit?model=gpt2&gpu=T4&solve=batch&top=3")
    assert status == 400 and "memfit fit takes no option 'top'" in body["error"]
    status, _, body = get(f"{server}/api/fit?model=gpt2&solve=batch")
    assert body["error"] == cli_error("fit", "gpt2", "--solve", "batch")


def test_bad_input_is_a_400_with_the_cli_message(server: str) -> None:
    status, _, body = get(f"{server}/api/estimate?model=gpt2&engine=analytic&batch=0")
    assert status == 400 and body["exit_code"] == 2
    assert body["error"] == cli_error("estimate", "gpt2", "--engine", "analytic", "--batch", "0")
    status, _, body = get(f"{server}/api/estimate?model=gpt2&precision=fp7")
    assert status == 400 and "invalid choice: 'fp7'" in body["error"]
    status, _, body = get(f"{server}/api/estimate?model=no-such-model-xyz&engine=analytic")
    assert status == 400 and body["error"].startswith("memfit: error: ")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("model=gpt2&trust-remote-code=1", "trust-remote-code is not available"),
        ("model=mypkg.models:make", "never imports code"),
        ("model=gpt2&log=/etc/passwd", "log is not available"),
        ("model=gpt2&no-such=1", "takes no option 'no-such'"),
        ("model=gpt2&html=/tmp/x.html", "html is not available"),
        ("batch=2", "model is required"),
        ("model=gpt2&config=%5B1%5D", "config must be a JSON object"),
        ("model=gpt2&config=%7Bnope", "is not valid JSON"),
    ],
)
def test_the_api_refuses_what_a_web_caller_may_not_ask(
    server: str, query: str, message: str
) -> None:
    status, _, body = get(f"{server}/api/estimate?{query}")
    assert status == 400 and message in body["error"]


def test_a_pasted_config_is_estimated_as_its_file_would_be(server: str, tmp_path: Path) -> None:
    from tests.conftest import TINY_LLAMA

    text = json.dumps(TINY_LLAMA)
    (tmp_path / "config.json").write_text(text)
    status, _, body = get(
        f"{server}/api/estimate?engine=analytic&"
        + urllib.parse.urlencode({"config": text, "precision": "bf16"})
    )
    _, expected = cli_json("estimate", str(tmp_path), "--engine", "analytic", "--precision", "bf16")
    assert status == 200
    assert body["peak_allocated_bytes"] == expected["peak_allocated_bytes"]
    assert body["components"] == expected["components"]


def test_an_oversized_url_is_refused_before_any_work(server: str) -> None:
    status, _, body = get(f"{server}/api/estimate?model=gpt2&config={'x' * 20_000}")
    assert status in (414, 400)  # ours (414) or the HTTP parser's own bound


def test_the_page_allows_nothing_from_elsewhere(server: str) -> None:
    with urllib.request.urlopen(f"{server}/", timeout=30) as r:
        csp = r.headers["Content-Security-Policy"]
        html = r.read().decode()
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "http://" not in html and "https://" not in html


def test_a_foreign_host_header_is_refused(server: str) -> None:
    request = urllib.request.Request(f"{server}/api/schema", headers={"Host": "evil.example"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 400


def test_the_schema_lists_every_flag_of_the_table(server: str) -> None:
    from memfit.flags import flags_for

    _, _, body = get(f"{server}/api/schema")
    assert [f["key"] for f in body["workload"]] == [f.name[2:] for f in flags_for("estimate")]
    t4 = next(g for g in body["gpus"] if g["name"] == "T4")
    assert t4["capacity_measured"] and t4["capacity_bytes"] == int(14.563 * 2**30)  # not 15 GiB


def test_the_gpu_table_applies_the_estimate_verdict(server: str) -> None:
    _, _, est = get(f"{server}/api/estimate?model=gpt2&engine=analytic&gpu=T4")
    _, _, rows = get(
        f"{server}/api/gpu-table?device_used_bytes={est['device_used_bytes']}"
        f"&device_used_bytes_high={est['device_used_bytes_high']}"
    )
    t4 = next(r for r in rows if r["gpu"] == "T4")
    assert t4["fits"] is est["fits"]["fits"] and t4["free_bytes"] == est["fits"]["free_bytes"]


@pytest.mark.parametrize(
    ("query", "argv"),
    [
        ("model=llama-3.1-8b&runtime=sglang&gpu=L4&solve=concurrency&seq=8192",
         ["fit", "llama-3.1-8b", "--runtime", "sglang", "--gpu", "L4", "--solve", "concurrency",
          "--seq", "8192"]),
        ("model=llama-3.1-8b:Q4_K_M&runtime=llama.cpp&gpu=RTX-3060&solve=max-model-len",
         ["fit", "llama-3.1-8b:Q4_K_M", "--runtime", "llama.cpp", "--gpu", "RTX-3060", "--solve",
          "max-model-len"]),
    ],
)  # fmt: skip
def test_api_fit_offers_the_serving_runtimes(server: str, query: str, argv: list[str]) -> None:
    """issue 31: the page's fit takes --runtime sglang | llama.cpp as the CLI does."""
    status, headers, body = get(f"{server}/api/fit?{query}")
    code, expected = cli_json(*argv)
    assert status == 200 and headers["X-Memfit-Exit"] == str(code) == "0"
    assert without_timings(body) == without_timings(expected) and body["max_value"] > 0
