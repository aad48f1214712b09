"""``python -m gpumem_kernel ARGS``: runs the ``gpumem-kernel`` binary with ARGS, in this process.

The wheel's kernelspec starts the kernel this way (``["python", "-m", "gpumem_kernel",
"--connection-file", "{connection_file}"]``: Jupyter replaces ``python`` with its own
interpreter), so the kernel is found in Jupyter's environment whether or not that environment is
activated, and Jupyter's signals and kills reach the kernel itself (``execv`` keeps the pid).
"""

import os
import sys

from gpumem_kernel._find import find_gpumem_kernel_bin


def main() -> None:
    exe = find_gpumem_kernel_bin()
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
