"""On-demand prices: every catalog GPU has a priced row with its source and date or a reason,
and a user's price file overrides them, with one clear error for each bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.errors import SpecError
from memfit.hardware import get_gpu, list_gpus
from memfit.hardware.prices import (
    PRICES_ENV,
    GPUPrice,
    bundled_prices,
    load_prices,
)
from memfit.userfiles import UserFileError


def test_every_catalog_gpu_has_a_price_row_and_every_row_a_catalog_gpu():
    assert set(bundled_prices()) == {g.name for g in list_gpus()}


def test_every_catalog_gpu_row_names_its_source():
    for gpu in list_gpus():
        assert gpu.source.startswith("https://"), gpu.name
        assert gpu.rate_source is None or gpu.rate_source.startswith("https://"), gpu.name


def test_a_price_has_a_source_a_provider_and_a_date_and_no_price_has_a_reason():
    priced = 0
    for name, price in bundled_prices().items():
        if price.usd_per_hour is None:
            assert price.reason, name
            assert price.source is None, name
        else:
            priced += 1
            assert 0.05 < price.usd_per_hour < 50, name  # one GPU for an hour, in US dollars
            assert price.source.startswith("https://"), name
            assert price.provider and price.offer, name
            assert price.as_of is not None and price.as_of.startswith("2026-"), name
    assert priced >= 20  # the common cloud GPUs are priced (A10G, L4, A100, H100, ...)
    assert bundled_prices().of("A10G").usd_per_hour == pytest.approx(1.006)


def test_consumer_cards_without_a_cloud_price_say_why():
    reason = bundled_prices().of("RTX-4060-Ti-16GB").reason
    assert reason is not None and "GeForce" in reason


def test_a_catalog_price_without_a_source_or_date_is_refused():
    with pytest.raises(SpecError, match=r"X: source \(None\) must be an https:// URL"):
        GPUPrice(gpu="X", usd_per_hour=1.0, provider="P", as_of="2026-01-01")
    with pytest.raises(SpecError, match=r"X: a catalog price needs as_of"):
        GPUPrice(gpu="X", usd_per_hour=1.0, provider="P", source="https://p")
    with pytest.raises(SpecError, match=r"X: a GPU without a price needs a reason"):
        GPUPrice(gpu="X", usd_per_hour=None)


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_json_price_file_overrides_the_named_gpus_only(tmp_path: Path):
    path = _write(
        tmp_path,
        "p.json",
        json.dumps(
            {"prices": {"h100": 2.49, "NVIDIA A10G": {"usd_per_hour": 0.9, "as_of": "2026-11-30"}}}
        ),
    )
    table = load_prices(path, environ={})
    assert table.of("H100-80GB").usd_per_hour == 2.49
    assert table.of("H100-80GB").origin == path
    assert table.of("A10G").as_of == "2026-11-30"
    assert table.of("L4") == bundled_prices().of("L4")
    assert table.files == (path,)


def test_a_yaml_price_file_works_and_a_card_you_own_may_cost_nothing(tmp_path: Path):
    pytest.importorskip("yaml")
    path = _write(tmp_path, "p.yaml", "prices:\n  RTX 4090: 0\n  L4:\n    usd_per_hour: 0.7\n")
    table = load_prices(path, environ={})
    assert table.of("RTX-4090").usd_per_hour == 0
    assert table.of("L4").usd_per_hour == 0.7


def test_the_environment_names_the_file_and_the_flag_wins(tmp_path: Path):
    env_file = _write(tmp_path, "env.json", '{"T4": 0.3}')
    flag_file = _write(tmp_path, "flag.json", '{"T4": 0.4}')
    assert load_prices(environ={PRICES_ENV: env_file}).of("T4").usd_per_hour == 0.3
    assert load_prices(flag_file, environ={PRICES_ENV: env_file}).of("T4").usd_per_hour == 0.4
    assert load_prices(environ={}).of("T4") == bundled_prices().of("T4")


@pytest.mark.parametrize(
    ("text", "error", "match"),
    [
        ('{"H1000": 2}', SpecError, r"unknown GPU 'H1000': did you mean"),
        ('{"H100": -1}', SpecError, r"H100-80GB: usd_per_hour \(-1\) must be > 0"),
        ('{"H100": "cheap"}', SpecError, r"usd_per_hour \('cheap'\) must be a number"),
        ('{"H100": {"usd": 2}}', SpecError, r"H100: unknown field\(s\) usd \(allowed: usd_per"),
        ('{"H100": {"as_of": "2026-01-01"}}', SpecError, r"H100: needs usd_per_hour"),
        ('{"H100": {"usd_per_hour": 2, "as_of": "soon"}}', SpecError, r"as_of \('soon'\) must"),
        ("[1, 2]", SpecError, r"must map GPU names to prices"),
        ("{}", SpecError, r"must map GPU names to prices.*got nothing"),
        ('{"H100": 2,', UserFileError, r"price file .* is not valid JSON"),
        ('{"H100": NaN}', UserFileError, r"NaN is not valid JSON"),
    ],
)
def test_a_bad_price_file_is_refused_naming_the_file_and_the_problem(
    tmp_path: Path, text: str, error: type[Exception], match: str
):
    path = _write(tmp_path, "bad.json", text)
    with pytest.raises(error, match=match) as info:
        load_prices(path, environ={})
    assert "bad.json" in str(info.value)


def test_every_problem_of_a_price_file_is_reported_together(tmp_path: Path):
    path = _write(tmp_path, "bad.json", '{"H1000": 2, "L4": -3}')
    with pytest.raises(SpecError, match=r"unknown GPU 'H1000'.*; L4: usd_per_hour \(-3\)"):
        load_prices(path, environ={})


def test_a_missing_or_directory_price_file_is_a_user_file_error(tmp_path: Path):
    with pytest.raises(UserFileError, match=r"price file"):
        load_prices(str(tmp_path / "nope.json"), environ={})
    with pytest.raises(UserFileError, match=r"directory"):
        load_prices(str(tmp_path), environ={})


def test_a_gpu_outside_the_table_has_no_price_and_says_so():
    price = bundled_prices().of(type("G", (), {"name": "Custom-GPU"})())
    assert price.usd_per_hour is None and "not in the price table" in (price.reason or "")
    assert get_gpu("A10G").name in bundled_prices()
