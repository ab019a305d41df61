"""A pipeline's components are built once per process, and their facts and layouts are kept
(memfit.estimate.diffusion.built): a search over offload modes and weight formats builds each
component once, and gives the answers a fresh build gives."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("diffusers")

from tests.estimate.diffusion.test_pipeline import job, tiny_flux  # noqa: E402

from memfit.estimate.diffusion import built, pipelines  # noqa: E402
from memfit.estimate.diffusion.pipelines import estimate_pipeline  # noqa: E402
from memfit.spec.diffusion import DiffusionJob  # noqa: E402

#: What a "what makes it fit" search varies (plan/diffusion_infer.py): the offload mode, the
#: weight formats (bitsandbytes' nf4 / int8, GGUF), VAE tiling, layerwise casting.
VARIANTS = (
    {},
    {"offload": "model"},
    {"offload": "group", "offload_type": "block_level"},
    {"offload": "group", "offload_type": "leaf_level", "use_stream": True},
    {"offload": "sequential"},
    {"quant": "nf4"},
    {"quant": "nf4", "text_encoder_quant": "int8", "offload": "model"},
    {"quant": "gguf-q4_0"},
    {"vae_tiling": True},
    {"layerwise_casting": "fp8"},
)


@pytest.fixture(scope="module")
def flux_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_flux(tmp_path_factory.mktemp("tiny-flux-built"))


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new process starts with: nothing built, traced or laid out in memory."""
    for module, memo in ((pipelines, "_TRACES"), (pipelines, "_MODELS"), (built, "_FACTS"),
                         (built, "_LAYOUTS")):  # fmt: skip
        monkeypatch.setattr(module, memo, {})


@pytest.fixture
def new_process(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Nothing in memory (a new process); the components built are listed."""
    _forget(monkeypatch)
    builds: list[str] = []
    real = pipelines.build_component

    def counted(library: str, class_name: str, config: dict[str, object]) -> object:
        builds.append(class_name)
        return real(library, class_name, config)

    monkeypatch.setattr(pipelines, "build_component", counted)
    return builds


def _fresh(root: Path, j: DiffusionJob, monkeypatch: pytest.MonkeyPatch) -> object:
    """The answer with every component built for it alone (the behaviour before the memos)."""
    with monkeypatch.context() as m:
        _forget(m)
        return estimate_pipeline(root, j, name="tiny")


def test_a_search_builds_each_component_once_and_answers_as_fresh_builds(
    flux_tree: Path, new_process: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")  # in-process memos only
    jobs = [job(**kw) for kw in VARIANTS]  # type: ignore[arg-type]
    answers = [estimate_pipeline(flux_tree, j, name="tiny") for j in jobs]
    # four components, each traced (a traced module is not reused); then the transformer again
    # for the first other format (the later formats lay the same module out), the largest text
    # encoder for int8, the VAE for tiling (enable_tiling changes the module: traced again)
    first = ["CLIPTextModel", "T5EncoderModel", "FluxTransformer2DModel", "AutoencoderKL"]
    assert sorted(new_process[:4]) == sorted(first), new_process
    assert len(new_process) == 7 and len(set(new_process[4:])) == 3, new_process
    assert "FluxTransformer2DModel" in new_process[4:] and "AutoencoderKL" in new_process[4:]
    for j, answer in zip(jobs, answers, strict=True):
        assert answer == _fresh(flux_tree, j, monkeypatch), j
    # the formats changed the weights: the memo is not one layout for every format
    weights = {a.components[2].weights_bytes for a in answers}  # type: ignore[attr-defined]
    assert len(weights) >= 3


def test_kept_facts_and_layouts_let_another_job_build_nothing(
    flux_tree: Path, tmp_path: Path, new_process: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFIT_NO_CACHE", raising=False)
    estimate_pipeline(flux_tree, job(), name="tiny")
    assert len(new_process) == 4
    # a new process, another offload mode: the whole answer is a miss, its traces, facts and
    # layouts are kept: no component is built
    _forget(monkeypatch)
    other = job(offload="model")
    again = estimate_pipeline(flux_tree, other, name="tiny")
    assert len(new_process) == 4
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")
    assert again == _fresh(flux_tree, other, monkeypatch)


def test_a_corrupt_kept_layout_is_worked_out_again_never_used(
    flux_tree: Path, tmp_path: Path, new_process: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfit.estimate.derived import cache
    from memfit.estimate.trace_cache import FORMAT, KIND

    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFIT_NO_CACHE", raising=False)
    j = job(height=48, width=48)
    first = estimate_pipeline(flux_tree, j, name="tiny")
    kept = {
        p.stem: cache.load(p.stem, kind=KIND, fmt=FORMAT) for p in (tmp_path / "trace").iterdir()
    }
    layouts = {
        k: d["record"] for k, d in kept.items() if d and "tensor_allocs" in d.get("record", {})
    }
    assert len(layouts) == 4  # one per component
    for key, record in layouts.items():  # a negative count under a valid checksum
        cache.store(key, {"record": {**record, "weights_bytes": -1}}, kind=KIND, fmt=FORMAT)
    for key, d in kept.items():
        if d and "answer" in d:
            (tmp_path / "trace" / f"{key}.json").unlink()  # the whole answer gone
    _forget(monkeypatch)
    assert estimate_pipeline(flux_tree, j, name="tiny") == first
    assert len(new_process) == 8  # each component built again for its layout, none kept bad
    again = {k: cache.load(k, kind=KIND, fmt=FORMAT) for k in layouts}
    assert all(d and d["record"]["weights_bytes"] >= 0 for d in again.values())  # replaced
