"""Issue 59, must-show 2, by the process's resident memory: serving the default model from
its Q4_1 file holds its weights in at most 1.2x their bytes in the file (the engine's own
accounting of its tensors is checked in test_gguf_blocks.py; this checks that no copy hides
outside it, e.g. a float32 copy of the 540 MB it would dequantize to).

In a fresh process: a tiny model is loaded once to start what any engine starts (threads,
kernels, the tokenizer's library), then again as the control: what an engine of the same
vocabulary and KV budget holds besides its weights. Then the default model. Its resident
growth, less the control's growth besides its weights and less the quantized kernels'
panel buffer (a working buffer of float32 rows, held by the thread that ran the first
steps), is what the default model's weights take. Sizes only, no clock.
"""

from __future__ import annotations

import json
import subprocess
import sys

from gguf import GGUFReader

from loragate.engine.loading.default_model import default_model_path

MEASURE = """
import gc, json, sys
from loragate.engine import LLM
from loragate.kernels.quant_linear import held_panel_bytes

def resident():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024

def load(model=None):
    options = dict(max_model_len=256, kv_cache_memory_gb=0.05, dtype="float32")
    llm = LLM(model=model, **options) if model else LLM(**options)
    gc.collect()
    return llm, sum(llm.llm_engine.model.weight_bytes().values())

started = load(sys.argv[1])
before = resident()
control, control_weights = load(sys.argv[1])
between = resident()
served, weights = load()
after = resident()
print(json.dumps({
    "control_besides_weights": between - before - control_weights,
    "default_growth": after - between,
    "panel": held_panel_bytes(),
    "accounted": weights,
}))
"""


def test_the_default_model_is_resident_in_its_files_bytes(tiny_model_dir):
    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(default_model_path()).tensors)
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tiny_model_dir("llama"))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    weights = got["default_growth"] - got["control_besides_weights"] - got["panel"]
    assert weights <= 1.2 * file_bytes, (weights / file_bytes, got)
    # ...and the measure sees them: the weights the engine accounts are resident.
    assert weights >= 0.9 * got["accounted"], (weights / file_bytes, got)
