"""Extract the frameworks' own config schemas for the layout-export tests (a tool, not a test).

The repository's tests cannot install torchtitan, Megatron-LM or DeepSpeed; they check the
exports of :mod:`memfit.plan.layout_export` against what this script reads from the frameworks'
sources at a pinned commit (``/work/.mirror/<owner>+<name>/repo``, bare git mirrors) and writes
to ``tests/plan/data/framework_schemas.json``:

- torchtitan 0.3.0 (the PyPI release, ``--torchtitan-configs``): the fields of
  ``TrainingConfig`` and ``ParallelismConfig`` in ``torchtitan/config/configs.py`` (the
  ``--training.*`` / ``--parallelism.*`` overrides), read with ``ast``; torchtitan 0.2.2 (the
  mirror's tag): the fields of
  ``Training``, ``Parallelism`` and ``ActivationCheckpoint`` in ``torchtitan/config/job_config.py``
  (its TOML sections).
- Megatron-LM: every option of the real parser, ``add_megatron_arguments(ArgumentParser())`` of
  ``megatron/training/arguments.py`` — built by importing Megatron from a checkout of the mirror
  (``--megatron-src DIR``) with triton / Python-3.12-only names stubbed, since only the parser is
  used: option strings, nargs (0 for switches), choices, type.
- DeepSpeed: the keys its config classes read — the string constants of
  ``deepspeed/runtime/constants.py`` and ``activation_checkpointing/config.py``, the fields of
  ``DeepSpeedZeroConfig`` (``zero/config.py``) and ``TPTrainingConfig``
  (``tensor_parallel/config.py``), read with ``ast`` / regex.

    .venv/bin/python benchmarks/framework_schemas.py [--megatron-src /tmp/fw/NVIDIA+Megatron-LM]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "tests" / "plan" / "data" / "framework_schemas.json"
MIRROR = Path("/work/.mirror")


def show(repo: str, rev: str, path: str) -> str:
    git = ["git", f"--git-dir={MIRROR / repo / 'repo'}"]
    return subprocess.run([*git, "show", f"{rev}:{path}"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def commit(repo: str, rev: str) -> str:
    git = ["git", f"--git-dir={MIRROR / repo / 'repo'}"]
    out = subprocess.run([*git, "rev-parse", rev], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def class_fields(source: str, *names: str) -> dict[str, dict[str, str]]:
    """``{class: {field: annotation}}`` of the annotated class attributes."""
    out: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name in names:
            out[node.name] = {
                s.target.id: ast.unparse(s.annotation)
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    return out


def torchtitan(configs_py: Path | None, old: dict[str, object]) -> dict[str, object]:
    repo = "pytorch+torchtitan"
    if configs_py is None:  # keep what an earlier run read from the released package
        cli = old["torchtitan"]["cli"]  # type: ignore[index]
    else:
        head = class_fields(configs_py.read_text(), "TrainingConfig", "ParallelismConfig")
        cli = {"version": "torchtitan 0.3.0 (PyPI)", "training": head["TrainingConfig"],
               "parallelism": head["ParallelismConfig"]}  # fmt: skip
    old = class_fields(show(repo, "v0.2.2", "torchtitan/config/job_config.py"),
                       "Training", "Parallelism", "ActivationCheckpoint")  # fmt: skip
    return {
        "cli": cli,
        "toml": {"commit": commit(repo, "v0.2.2"), "training": old["Training"],
                 "parallelism": old["Parallelism"],
                 "activation_checkpoint": old["ActivationCheckpoint"]},
    }  # fmt: skip


def deepspeed() -> dict[str, object]:
    repo = "deepspeedai+DeepSpeed"
    const = re.compile(r"""^[A-Z_0-9]+\s*=\s*['"]([a-z_0-9]+)['"]\s*$""", re.M)
    top = set(const.findall(show(repo, "HEAD", "deepspeed/runtime/constants.py")))
    zero_py = show(repo, "HEAD", "deepspeed/runtime/zero/config.py")
    top |= set(re.findall(r"""^ZERO_OPTIMIZATION\s*=\s*['"]([a-z_]+)['"]""", zero_py, re.M))
    top |= {"tensor_parallel", "sequence_parallel_size", "activation_checkpointing"}
    readers = show(repo, "HEAD", "deepspeed/runtime/config.py")
    readers += show(repo, "HEAD", "deepspeed/runtime/tensor_parallel/config.py")
    for key in ("tensor_parallel", "sequence_parallel_size"):  # read where the JSON is parsed
        if f'"{key}"' not in readers and f"'{key}'" not in readers:
            top.discard(key)
    ac_py = show(repo, "HEAD", "deepspeed/runtime/activation_checkpointing/config.py")
    ac = set(const.findall(ac_py))
    zero = class_fields(zero_py, "DeepSpeedZeroConfig")["DeepSpeedZeroConfig"]
    tp = class_fields(show(repo, "HEAD", "deepspeed/runtime/tensor_parallel/config.py"),
                      "TPTrainingConfig")["TPTrainingConfig"]  # fmt: skip
    return {
        "commit": commit(repo, "HEAD"),
        "top_level": sorted(top),
        "zero_optimization": zero,
        "tensor_parallel": tp,
        "activation_checkpointing": sorted(ac),
        "bf16": ["enabled"],
    }


#: Run inside a Megatron checkout: stub what the parser never calls, dump the options.
_MEGATRON_DUMP = r"""
import argparse, importlib.abc, importlib.machinery, json, sys, types, typing
class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"): raise AttributeError(name)
        return _Meta(name, (_Any,), {})
    def __getitem__(cls, key): return cls
class _Any(metaclass=_Meta):
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return a[0] if len(a) == 1 and callable(a[0]) else self
    def __getattr__(self, name):
        if name.startswith("__"): raise AttributeError(name)
        return _Meta(name, (_Any,), {})
    def __getitem__(self, key): return self
class _Stub(types.ModuleType):
    __path__ = []
    def __getattr__(self, name):
        if name.startswith("__"): raise AttributeError(name)
        return _Meta(name, (_Any,), {})
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("triton", "cpuinfo", "einops"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec): return _Stub(spec.name)
    def exec_module(self, module): module.__version__ = "3.0.0"
sys.meta_path.insert(0, _Finder())
if not hasattr(typing, "override"): typing.override = lambda f: f
sys.path.insert(0, "."); sys.argv = ["x"]
from megatron.training.arguments import add_megatron_arguments
p = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
switch = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)
rows = [{"flags": a.option_strings, "nargs": 0 if isinstance(a, switch) else a.nargs,
         "choices": None if a.choices is None else [str(c) for c in a.choices],
         "type": getattr(a.type, "__name__", None) if a.type else None}
        for a in p._actions if a.option_strings and a.dest != "help"]
print(json.dumps(rows))
"""


def megatron(src: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", _MEGATRON_DUMP], cwd=src, capture_output=True,
                          text=True, check=True)  # fmt: skip
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return {"commit": commit("NVIDIA+Megatron-LM", "HEAD"), "options": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron-src", type=Path, help="a checkout of the Megatron-LM mirror")
    ap.add_argument(
        "--torchtitan-configs",
        type=Path,
        help="torchtitan/config/configs.py of the installed torchtitan 0.3.0 (pip install "
        "--no-deps torchtitan==0.3.0 into a scratch venv)",
    )
    args = ap.parse_args()
    old = json.loads(OUTPUT.read_text()) if OUTPUT.exists() else {}
    out = {
        "_comment": "written by benchmarks/framework_schemas.py; see its docstring",
        "torchtitan": torchtitan(args.torchtitan_configs, old),
        "deepspeed": deepspeed(),
        "megatron": megatron(args.megatron_src) if args.megatron_src else old.get("megatron"),
    }
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
