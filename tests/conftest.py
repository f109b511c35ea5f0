"""Shared fixtures. Triton kernels run under the interpreter when no GPU is present."""

import os

import torch

# The suite compares with float32 references (HF, PEFT), so dtype="auto" must resolve to
# float32 here, in this process and in every server it starts; a machine with native bf16
# would otherwise pick bf16. Tests of the choice itself set the variable themselves.
os.environ["LORAGATE_CPU_BF16"] = "0"

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
