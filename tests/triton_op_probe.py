"""Run without TRITON_INTERPRET (the test does): traces the Add & Norm operators the way Inductor does, on
meta tensors, and prints as JSON what its forward and backward graphs hold.

No GPU is needed to trace: Triton compiles each kernel to TTIR for an assumed sm_90 target (a stand-in
driver says which), which is how torch finds which arguments a kernel writes.
"""

import json
import logging

import torch
import triton
from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.decomposition import select_decomp_table
from triton.backends.compiler import GPUTarget

from resnorm_lm.model.kernels import add_norm_ops as ops


class TargetOnlyDriver:
    """What torch's kernel-mutation analysis asks of Triton's driver, on a machine without a GPU."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("meta")


def block(x, d, w, b):
    """An add & LayerNorm, then an RMSNorm without the add, as a placement calls them."""
    s, y = ops.add_norm(x, d, w, b, 1e-5, False)  # (R, 48) each
    return ops.norm(y * 2, w, None, 1e-5, True) + s


def backward_ttir() -> str:
    """The backward kernel's TTIR for LayerNorm with a bias and an incoming ds, 768 wide, 4-row tiles."""
    from torch._higher_order_ops.triton_kernel_wrap import generate_ttir

    from resnorm_lm.model.kernels.add_norm import _add_norm_bwd

    rows, n = 64, 768
    t = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    kwargs = dict(
        DY=t(rows, n),
        DS=t(rows, n),
        S=t(rows, n),
        W=t(n),
        Mean=t(rows),
        Rstd=t(rows),
        DX=t(rows, n),
        DW=t(4, n),
        DB=t(4, n),
        M=rows,
        N=n,
        BLOCK_M=4,
        BLOCK_N=1024,
        IS_RMS=False,
        HAS_DS=True,
        HAS_BIAS=True,
    )
    return str(generate_ttir(_add_norm_bwd, kwargs, {})[0])


def trace(autotuned: bool) -> list[str]:
    """The forward and backward graphs of ``block`` as Inductor would receive them, over three row counts,
    with the heuristic launch configuration or with triton.autotune's (as on a GPU)."""
    from resnorm_lm.model.kernels import add_norm

    add_norm._autotuning = lambda device: autotuned  # meta tensors are no GPU: say which path to take
    torch._dynamo.reset()
    graphs: list[str] = []

    def capture(gm, example_inputs):
        graphs.append(gm.code)
        return make_boxed_func(gm)

    # Inductor's own decompositions and partitioner, with the graphs captured instead of compiled
    backend = aot_autograd(
        fw_compiler=capture,
        bw_compiler=capture,
        decompositions=select_decomp_table(),
        partition_fn=min_cut_rematerialization_partition,
    )
    compiled = torch.compile(block, backend=backend, dynamic=True, fullgraph=True)
    w, b = (torch.empty(48, device="meta", requires_grad=True) for _ in range(2))
    for rows in (8, 5, 13):  # a new row count must reuse the graphs (symbolic grid), not recompile
        x, d = (torch.empty(rows, 48, device="meta", requires_grad=True) for _ in range(2))
        compiled(x, d, w, b).sum().backward()
    return graphs


def main() -> None:
    triton.runtime.driver.set_active(TargetOnlyDriver())
    logging.getLogger("torch._higher_order_ops.triton_kernel_wrap").setLevel(logging.ERROR)
    graphs = {"heuristic": trace(False), "autotuned": trace(True)}
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    names = {i: getattr(k, "fn", k).__name__ for i, k in kernel_side_table.id_to_kernel.items()}
    print(json.dumps({"graphs": graphs, "kernels": names, "backward_ttir": backward_ttir()}))


if __name__ == "__main__":
    main()
