"""Import diffusers, working around a known incompatibility of older diffusers with torchao 0.18.

diffusers 0.36.0's ``quantizers/torchao/torchao_quantizer.py`` calls ``logger.warning`` at import
time, before ``logger`` is defined, when torchao no longer exports ``NF4Tensor`` from
``torchao.dtypes`` (torchao >= 0.15): the import of any model class then fails with
``NameError: name 'logger' is not defined``. memfit builds models on the meta device and never
runs torchao through diffusers, so it tells diffusers torchao is unavailable in exactly that
combination (``diffusers.utils.import_utils._torchao_available``), before the quantizers load.
(diffusers 0.42 defines the logger first and only warns; the same switch keeps that warning out.)
Import-time warnings of diffusers' own modules (autocast without CUDA) are silenced too.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from memfit.errors import NotModelledError


@lru_cache(maxsize=1)
def diffusers_module() -> Any:
    try:
        import diffusers.utils.import_utils as iu
    except ImportError as exc:
        raise NotModelledError(
            "diffusion pipelines need the diffusers package: pip install 'memfit[diffusion]'",
            engine="diffusion",
        ) from exc
    if iu.is_torchao_available():
        try:
            from torchao.dtypes import NF4Tensor  # noqa: F401
        except ImportError:
            iu._torchao_available = False
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import diffusers

        diffusers.FluxTransformer2DModel  # noqa: B018  (the lazy import, under the filter)
    return diffusers
