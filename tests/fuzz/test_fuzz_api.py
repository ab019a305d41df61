"""Property tests of the public functions and the readers: any value of any type is either
accepted or refused with a memfit error (field, value, rule) — never an AttributeError or
TypeError from deep inside, never a hang."""

from __future__ import annotations

import contextlib
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memfit
from memfit.errors import MemfitError, SpecError
from memfit.snapshot import analyze_snapshot
from memfit.spec import WorkloadSpec
from memfit.userfiles import UserFileError, parse_json, read_json

FAST = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.text(max_size=4), max_size=3),
    st.tuples(st.integers(), st.text(max_size=3)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
FIELDS = sorted(f for f in WorkloadSpec.__dataclass_fields__)


@FAST
@given(values=st.dictionaries(st.sampled_from(FIELDS), ANY_VALUE, max_size=4))
def test_a_workload_spec_of_any_values_is_built_or_refused_with_a_spec_error(
    values: dict[str, Any],
) -> None:
    try:
        w = WorkloadSpec(**values)
    except SpecError as exc:
        assert any(name in str(exc) for name in values) or "problems" in str(exc)
        return
    for name, value in values.items():  # what was accepted is what was asked (or normalised)
        got = getattr(w, name)
        defaulted = value is None and name in (
            "optimizer",
            "shard",
            "precision",
        )  # None: the mode's default
        # precision_defaulted says whether __post_init__ chose the precision: set there when
        # no precision is given, whatever was passed
        defaulted = defaulted or (name == "precision_defaulted" and w.precision_defaulted)
        assert defaulted or got == value or (isinstance(value, list) and got == tuple(value)), name


@FAST
@given(workload=ANY_VALUE, gpu=ANY_VALUE, flag=ANY_VALUE)
def test_estimate_refuses_wrong_argument_types_with_a_spec_error(
    workload: Any, gpu: Any, flag: Any
) -> None:
    with contextlib.suppress(MemfitError):
        memfit.estimate(
            "gpt2",
            workload,
            gpu=gpu,
            engine="analytic",
            trust_remote_code=flag if isinstance(flag, bool) else False,
            allow_code=flag,
        )


def test_estimate_with_a_mode_string_names_the_workload_spec_to_pass() -> None:
    with pytest.raises(
        SpecError, match=r"workload \('train'\) must be a WorkloadSpec.*mode='train'"
    ):
        memfit.estimate("gpt2", "train")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [{"lora_rank": 8, "lora_targets": 123}, {"lora_rank": 8, "lora_targets": None}],
)
def test_lora_targets_of_the_wrong_type_are_refused_at_construction(kwargs: dict) -> None:
    with pytest.raises(SpecError, match="lora_targets .* must be 'all-linear' or a non-empty"):
        WorkloadSpec(**kwargs)


def test_freeze_layers_true_and_a_huge_lora_rank_are_refused() -> None:
    with pytest.raises(SpecError, match=r"freeze_layers \(True\) must be an integer"):
        WorkloadSpec(freeze_layers=True)
    with pytest.raises(SpecError, match="lora_rank .* wider than any model's layers"):
        WorkloadSpec(lora_rank=10**30)


@pytest.mark.parametrize("call", ["plan", "fit", "doctor", "upgrade_verdict"])
def test_the_planning_functions_refuse_a_factory_without_allow_code(call: str) -> None:
    fn = getattr(memfit, call)
    args: tuple[Any, ...] = ("code:interact",)
    if call in ("fit", "doctor"):
        args += (WorkloadSpec(),)
    kwargs: dict[str, Any] = {"gpu": "L4"}
    if call == "fit":
        kwargs["solve"] = "batch"
    with pytest.raises(SpecError, match="allow_code=True"):
        fn(*args, **kwargs)


@FAST
@given(data=st.binary(max_size=2048))
def test_any_bytes_as_a_json_file_parse_or_raise_a_user_file_error(
    data: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("j") / "x.json"
    path.write_bytes(data)
    with contextlib.suppress(UserFileError):
        read_json(path, what="estimate")


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", "[" * 50_000 + "]" * 50_000])
def test_non_json_constants_and_deep_nesting_are_user_file_errors(text: str) -> None:
    with pytest.raises(UserFileError, match="not valid JSON|nested too deeply"):
        parse_json(text, what="estimate", source="x")


SNAPSHOT = pickle.dumps(
    {"segments": [], "device_traces": [[{"action": "alloc", "addr": 1, "size": 512}]]}, protocol=4
)


@FAST
@given(at=st.integers(0, len(SNAPSHOT) - 1), byte=st.integers(0, 255), stream=st.booleans())
def test_a_snapshot_with_any_byte_changed_is_read_or_refused_never_hung(
    at: int, byte: int, stream: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path: Path = tmp_path_factory.mktemp("s") / "snap.pickle"
    path.write_bytes(SNAPSHOT[:at] + bytes([byte]) + SNAPSHOT[at + 1 :])
    with contextlib.suppress(MemfitError):
        analyze_snapshot(path, stream=stream)
