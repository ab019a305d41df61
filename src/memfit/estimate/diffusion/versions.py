"""Library-version rules that change a pipeline's memory, for the versions the user has installed
(or, for a published measurement, the versions it was made with).

* **transformers 4.x keeps ``_keep_in_fp32_modules`` in fp32 under bitsandbytes.** Its
  ``from_pretrained`` keeps those modules in fp32 when the dtype is fp16 *or the quantizer sets
  ``use_keep_in_fp32_modules``*, which the 4.x bitsandbytes quantizers do; the modules are also left
  unquantized. So a bitsandbytes T5 under transformers 4.x holds its 24 ``wo`` linears in fp32.
  transformers 5 keeps them in the run's dtype (``_keep_in_fp32_modules`` only at fp16,
  ``_keep_in_fp32_modules_strict`` at fp16 and bf16), still unquantized.
* **bitsandbytes 8-bit components get no offload hook under older versions.** diffusers'
  ``enable_model_cpu_offload`` (``pipelines/pipeline_utils.py``, 0.42.1) skips the hook of a
  component loaded in bitsandbytes 8-bit when transformers < 4.58.0 or bitsandbytes < 0.48.0
  ("as it is loaded in `bitsandbytes` 8bit"): such a component stays on the device for the
  whole run and is not part of the hook chain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata


def installed(package: str) -> str | None:
    """The installed version of ``package``, or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def parse(version: str) -> tuple[int, ...]:
    """The leading release numbers of ``version`` ("4.57.1" -> (4, 57, 1); "4.x" -> (4,))."""
    nums = re.findall(r"\d+", version.split("+")[0].split("dev")[0])
    return tuple(int(n) for n in nums[:3])


@dataclass(frozen=True, kw_only=True)
class LibraryBehaviour:
    """The version-dependent rules above, for one pair of versions."""

    transformers: str
    bitsandbytes: str
    #: transformers 4.x: bitsandbytes models keep ``_keep_in_fp32_modules`` in fp32
    bnb_keeps_fp32_modules_in_fp32: bool
    #: diffusers hooks bitsandbytes 8-bit components for model offload (else they stay on device)
    bnb_8bit_offload_hooks: bool


def behaviour(transformers: str | None, bitsandbytes: str | None) -> LibraryBehaviour:
    """The rules for these versions; None: the installed version (a package that is not
    installed counts as current: its rules cannot apply)."""
    tf = transformers or installed("transformers") or "5"
    bnb = bitsandbytes or installed("bitsandbytes") or "0.48"
    return LibraryBehaviour(
        transformers=tf,
        bitsandbytes=bnb,
        bnb_keeps_fp32_modules_in_fp32=parse(tf)[:1] < (5,),
        # diffusers: skipped when transformers < 4.58.0 or bitsandbytes < 0.48.0
        bnb_8bit_offload_hooks=parse(tf) >= (4, 58) and parse(bnb) >= (0, 48),
    )
