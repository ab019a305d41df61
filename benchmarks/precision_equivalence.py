"""Proof that the precision rename moved no figure: the old meaning, named explicitly, is the old
answer byte for byte.

The default training precision changed on purpose (issue 12): ``bf16`` used to train pure bf16
weights and states (8 B/param with AdamW) and now resolves, as Lightning and HF Trainer read it, to
``bf16-mixed`` (fp32 master weights, 16 B/param). This script re-runs every estimate of a
behaviour snapshot (``benchmarks/behaviour_snapshot.py --write``, taken before the change) with the
precision the old name meant, written by its new canonical name, and compares the whole
``MemoryEstimate.to_json()`` with the snapshot, except the ``workload.precision`` string itself
(the name is the change). The old meanings (memfit.spec.rules):

=============  ===================================  =====================================
old name       trained as                           new name that runs the same step
=============  ===================================  =====================================
bf16 / fp16    pure 16-bit (under ZeRO: DeepSpeed's  bf16-true / 16-true (under ZeRO:
               16-bit model with fp32 masters)      bf16-mixed / 16-mixed, run the same)
fp32           fp32                                 32-true
amp-bf16/fp16  autocast over fp32 weights           bf16-mixed / 16-mixed
=============  ===================================  =====================================

The ``estimate`` commands of the snapshot's CLI runs are re-run the same way (their ``fits``
verdict object is left out: the verdict rule changed on purpose too).

    .venv/bin/python benchmarks/precision_equivalence.py /work/baseline.json [--trace]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.behaviour_snapshot import _cli, _diff, _scrub  # noqa: E402

OLD_MEANING = {
    "bf16": "bf16-true",
    "fp16": "16-true",
    "fp32": "32-true",
    "amp-bf16": "bf16-mixed",
    "amp-fp16": "16-mixed",
}
ZERO = ("zero1", "zero2", "zero3")


def old_meaning(workload: dict[str, Any]) -> str | None:
    """The canonical name of what ``workload``'s precision meant before the rename (None: no
    canonical name runs that step: AMP over fp32 weights under ZeRO)."""
    old = workload.get("precision", "bf16")
    zero = workload.get("shard") in ZERO and workload.get("mode", "train") == "train"
    if zero and old in ("amp-bf16", "amp-fp16"):
        return None
    if zero and old in ("bf16", "fp16"):
        return "bf16-mixed" if old == "bf16" else "16-mixed"
    return OLD_MEANING[old]


def _unnamed(est: dict[str, Any]) -> dict[str, Any]:
    out = dict(est)
    out["workload"] = {k: v for k, v in est.get("workload", {}).items() if k != "precision"}
    return out


def check_estimates(before: dict[str, Any], section: str) -> tuple[int, list[str]]:
    import memfit

    n, diffs = 0, []
    for key, old in before.get(section, {}).items():
        engine, model, overrides = key.split(" ", 2)
        workload = json.loads(overrides)
        mapped = old_meaning(workload)
        if mapped is None:
            diffs.append(f"{key}: no canonical name runs the old step")
            continue
        est = memfit.estimate(
            model, memfit.WorkloadSpec(**{**workload, "precision": mapped}), engine=engine
        )
        _diff(_unnamed(_scrub(old)), _unnamed(_scrub(est.to_json())), key, diffs)
        n += 1
    return n, diffs


def check_cli(before: dict[str, Any]) -> tuple[int, list[str]]:
    n, diffs = 0, []
    for key, old in before.get("cli", {}).items():
        args = key.split()
        if args[0] != "estimate":
            continue
        flags = dict(zip(args[2::2], args[3::2], strict=False))
        workload = {"shard": flags.get("--shard"), "mode": flags.get("--mode", "train")}
        workload["precision"] = flags.get("--precision", "bf16")
        mapped = old_meaning(workload)
        new = _cli([*args, "--precision", str(mapped)])
        for run in (old, new):
            body = run["stdout"]
            if isinstance(body, dict):
                body.pop("fits", None)
                run["stdout"] = _unnamed(body)
        _diff(old, new, key, diffs)
        n += 1
    return n, diffs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path, help="a behaviour snapshot taken before")
    parser.add_argument("--trace", action="store_true", help="also the traced cases (minutes)")
    args = parser.parse_args()
    before = json.loads(args.snapshot.read_text())
    total, diffs = 0, []
    for section in ("analytic", "trace") if args.trace else ("analytic",):
        n, d = check_estimates(before, section)
        total, diffs = total + n, diffs + d
    n, d = check_cli(before)
    total, diffs = total + n, diffs + d
    for line in diffs:
        print(line)
    print(f"{total} cases re-run with the old meaning named; {len(diffs)} difference(s)")
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
