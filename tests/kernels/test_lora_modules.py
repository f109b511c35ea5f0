"""kernels.lora_apply_modules: every module of a projection (q/k/v, gate/up or a single one)
adds its adapters' output to its own columns of the output, in one call, against the float64
per-module reference; the native call and the per-module torch path agree."""

import pytest
import torch
from kernel_reference import rel_error

from loragate import kernels
from loragate.kernels import lora_cpu, lora_modules

D_IN = 72
D_OUTS = (48, 24, 24)  # q, k, v of a grouped-query model: k and v narrower than q
RANK = 6
SLOTS = 4


def fused_group(dtype):
    """Per module, A [S, r, d_in] and B [S, d_out, r] as views of the slots' layout (B
    stored transposed), slot 2 empty, and its columns of the fused output."""
    made, start = [], 0
    for d_out in D_OUTS:
        a = torch.randn(SLOTS, RANK, D_IN, dtype=dtype)
        bt = torch.randn(SLOTS, RANK, d_out, dtype=dtype)
        a[2], bt[2] = 0, 0
        made.append((a, bt.transpose(1, 2), slice(start, start + d_out)))
        start += d_out
    return made


def reference(x, modules, slots, scales, before):
    """float64: token by token, module by module."""
    out = before.double().clone()
    for a, b, columns in modules:
        for row, slot in enumerate(slots.tolist()):
            if slot >= 0:
                delta = (x[row].double() @ a[slot].double().T) @ b[slot].double().T
                out[row, columns] += scales[slot].double() * delta
    return out


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("path", ["native", "per module"])
def test_every_module_adds_to_its_own_columns(dtype, bound, path, monkeypatch):
    torch.manual_seed(7)
    modules = fused_group(dtype)
    group = kernels.LoRAModules(modules)
    if path == "native":
        assert group.table is not None, lora_cpu.native_lora_error()

        def refuse(*args, **kwargs):
            raise AssertionError("the per-module path ran where the native call serves")

        monkeypatch.setattr(lora_modules, "lora_apply", refuse)
    else:
        group.table = None  # as where the native kernels cannot take the tensors
    slots = torch.tensor([3, -1, 0, 0, 2, 1, -1, 3])
    x = torch.randn(slots.shape[0], D_IN, dtype=dtype)
    scales = torch.rand(SLOTS) + 0.5
    fused = torch.randn(slots.shape[0], sum(D_OUTS), dtype=dtype)
    before = fused.clone()
    kernels.lora_apply_modules(x, group, slots, scales, fused, index=kernels.lora_index(slots, 4))
    assert rel_error(fused, reference(x, modules, slots, scales, before)) < bound
    assert torch.equal(fused[slots < 0], before[slots < 0]), "base-only rows must not change"


def test_bad_shapes_are_named():
    modules = fused_group(torch.float32)
    with pytest.raises(ValueError, match="columns"):
        kernels.LoRAModules([(modules[0][0], modules[0][1], slice(0, 7))])
    with pytest.raises(ValueError, match="differs from the first module"):
        kernels.LoRAModules([modules[0], (modules[1][0][:, :3], modules[1][1], modules[1][2])])
    group = kernels.LoRAModules(modules)
    slots = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="x must be"):
        kernels.lora_apply_modules(
            torch.randn(2, 5), group, slots, torch.ones(4), torch.zeros(2, 96)
        )
    with pytest.raises(ValueError, match="out must be"):
        kernels.lora_apply_modules(
            torch.randn(2, D_IN), group, slots, torch.ones(4), torch.zeros(2, 50)
        )
