"""gpumem-kernel: a Jupyter kernel for Rust (evcxr inside) with a GPU memory report after every cell.

The kernel is a Rust binary, ``gpumem-kernel``, installed on PATH by this wheel; this package only
finds it (``find_gpumem_kernel_bin``) and runs it (``python -m gpumem_kernel``, which is how the
wheel's kernelspec starts the kernel).
"""

from gpumem_kernel._find import find_gpumem_kernel_bin

__all__ = ["find_gpumem_kernel_bin"]
