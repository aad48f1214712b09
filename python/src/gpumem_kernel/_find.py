"""Where the wheel installed the ``gpumem-kernel`` binary."""

import os
import sys
import sysconfig

BIN = "gpumem-kernel"


def find_gpumem_kernel_bin() -> str:
    """The path of the ``gpumem-kernel`` binary installed with this package.

    The scripts directory of this interpreter's environment first (a virtualenv, a conda env, a
    system install), then the user scheme's (``pip install --user``), then the ``bin`` directory
    of the prefix this package was installed into (``pip install --prefix`` / ``--target``).
    """
    candidates = [sysconfig.get_path("scripts")]
    try:
        user_scheme = sysconfig.get_preferred_scheme("user")  # Python 3.10+
    except AttributeError:
        user_scheme = "posix_user"
    try:
        candidates.append(sysconfig.get_path("scripts", scheme=user_scheme))
    except KeyError:
        pass
    # <prefix>/lib/pythonX.Y/site-packages/gpumem_kernel -> <prefix>/bin
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "..", "..", "..", "bin"))
    # --target DIR: DIR/gpumem_kernel and DIR/bin
    candidates.append(os.path.join(here, "..", "bin"))
    for scripts in candidates:
        if scripts:
            path = os.path.normpath(os.path.join(scripts, BIN))
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    raise FileNotFoundError(
        f"{BIN} was not found beside this Python ({sys.executable}); looked in: "
        + ", ".join(os.path.normpath(c) for c in candidates if c)
        + ". Reinstall the gpumem-kernel wheel into this environment."
    )
