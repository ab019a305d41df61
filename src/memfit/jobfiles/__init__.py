"""Read the job files users already have — Hugging Face ``TrainingArguments`` / TRL configs,
axolotl, LLaMA-Factory, torchtune, LitGPT, DeepSpeed, accelerate — into one memfit job, and write
the edit that makes it fit back into their own format (``memfit check``).

Torch-free: files are read through :mod:`memfit.userfiles` (JSON strictly, YAML with
``safe_load``); nothing a file names is imported or executed.
"""

from memfit.jobfiles.edit import FileEdit, plan_edits
from memfit.jobfiles.files import FORMAT_NAMES, FORMATS, Job, JobFile, read_job
from memfit.jobfiles.job import model_of, workload_of

__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "FileEdit",
    "Job",
    "JobFile",
    "model_of",
    "plan_edits",
    "read_job",
    "workload_of",
]
