"""Run notebooks/tour.ipynb with jupyter_client + nbclient against the installed gpumem kernel.

Usage: python3 kernel/tests/tour_nbclient.py PATH/TO/gpumem-kernel [OUT_DIR]

Installs the kernelspec into a temporary prefix (found through JUPYTER_PATH), executes the tour
with the notebook's directory as the working directory, and checks: every cell ran without an
error, one per-cell report for every cell that runs code (none for magic-only cells), the history
table and the SVG chart are there, the %%gpumem timeline is there, and the snapshot files were
written and read back (JSON and pickle). Needs jupyter_client, nbclient and nbformat
(kernel/tests/run_tour.sh installs them in a virtualenv).
"""

import json
import os
import pickle
import subprocess
import sys
import tempfile

import nbformat
from nbclient import NotebookClient

CELL_MIME = "application/vnd.gpumem.cell+json"


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main():
    kernel_bin = os.path.abspath(sys.argv[1])
    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    out_dir = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else tempfile.mkdtemp()
    os.makedirs(out_dir, exist_ok=True)
    prefix = tempfile.mkdtemp(prefix="gpumem-kernelspec-")
    subprocess.check_call([kernel_bin, "install", "--prefix", prefix])
    spec_dir = os.path.join(prefix, "share", "jupyter", "kernels", "gpumem")
    spec = json.load(open(os.path.join(spec_dir, "kernel.json")))
    assert spec["display_name"] == "Rust (gpumem)" and spec["interrupt_mode"] == "message", spec
    for logo in ("logo-32x32.png", "logo-64x64.png"):
        assert open(os.path.join(spec_dir, logo), "rb").read(8) == b"\x89PNG\r\n\x1a\n", logo
    os.environ["JUPYTER_PATH"] = os.path.join(prefix, "share", "jupyter")

    from jupyter_client.kernelspec import KernelSpecManager

    assert "gpumem" in KernelSpecManager().find_kernel_specs(), "kernelspec not found through JUPYTER_PATH"

    nb_path = os.path.join(repo, "notebooks", "tour.ipynb")
    snap_dir = os.path.join(repo, "target", "tour", "snapshot")
    for f in ("snapshot.pickle", "snapshot.json", "trace_plot.html"):
        if os.path.exists(os.path.join(snap_dir, f)):
            os.remove(os.path.join(snap_dir, f))
    nb = nbformat.read(nb_path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="gpumem",
        timeout=1800,
        startup_timeout=600,
        resources={"metadata": {"path": os.path.dirname(nb_path)}},
    )
    client.execute()
    nbformat.validate(nb)
    out_nb = os.path.join(out_dir, "tour.executed.ipynb")
    nbformat.write(nb, out_nb)
    print("executed notebook:", out_nb)

    history = plot = timeline = False
    n_reports = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        src = cell.source
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if errors:
            fail(f"cell {src[:40]!r}: {errors[0].ename}: {errors[0].evalue}")
        reports = [o for o in cell.outputs if o.output_type == "display_data" and CELL_MIME in o.data]
        runs_code = any(
            line.strip() and not line.strip().startswith(("%gpumem", "%%gpumem", "//")) for line in src.splitlines()
        )
        if runs_code and len(reports) != 1:
            fail(f"cell {src[:40]!r}: {len(reports)} reports")
        if not runs_code and reports:
            fail(f"magic-only cell {src[:40]!r} got a report")
        n_reports += len(reports)
        for r in reports:
            rec = r.data[CELL_MIME]
            assert rec["cell"] == cell.execution_count, (rec["cell"], cell.execution_count)
            assert "text/html" in r.data and "<details>" in r.data["text/html"]
            assert r.data["text/plain"].startswith(f"[{rec['cell']}]")
        data = [o.data for o in cell.outputs if o.output_type == "display_data"]
        if src.strip() == "%gpumem history":
            history = any("<table" in d.get("text/html", "") for d in data)
        if src.strip() == "%gpumem plot":
            plot = any("<svg" in d.get("image/svg+xml", "") for d in data)
        if src.startswith("%%gpumem --timeline"):
            timeline = any("<svg" in d.get("image/svg+xml", "") for d in data)
    if not (history and plot and timeline):
        fail(f"history table {history}, plot {plot}, timeline {timeline}")

    # The snapshot files, read back.
    with open(os.path.join(snap_dir, "snapshot.json")) as f:
        snap = json.load(f)
    with open(os.path.join(snap_dir, "snapshot.pickle"), "rb") as f:
        pick = pickle.load(f)
    assert "segments" in snap and "segments" in pick, sorted(snap)
    assert len(snap["segments"]) == len(pick["segments"])
    labels = {e.get("user_metadata", "") for t in pick.get("device_traces", []) for e in t}
    assert any(l.startswith("cell ") for l in labels), labels
    assert "<svg" in open(os.path.join(snap_dir, "trace_plot.html")).read()
    print(f"OK: {n_reports} per-cell reports, history table, SVG chart, timeline, snapshot read back")
    fit_from_any_session(out_dir)


def fit_from_any_session(out_dir):
    """`%gpumem fit` in a session that never asked to record (issue 57): driver allocations past
    the allocator (what candle's are on a GPU), one kept and one made and dropped in a block, then
    two fits, held by scripts/gpu/fit_session_check.py to the records' tracked peak of device 0."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gpu"))
    import fit_session_check as fit_check

    cells = [
        ":dep gpumem-nb",
        "let keep = gpumem_nb::mem::driver_alloc_mib(100)?;",
        "{\n    let step = gpumem_nb::mem::driver_alloc_mib(300)?;\n    drop(step);\n}",
        "%gpumem fit 24GiB",
        "%gpumem fit 256MiB",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, kernel_name="gpumem", timeout=900, startup_timeout=600).execute()
    nbformat.write(nb, os.path.join(out_dir, "fit_any_session.executed.ipynb"))
    lines = fit_check.check(nb)
    print("\n".join(lines))
    if any(l.startswith("FAIL") for l in lines):
        fail("fit from a session that never asked to record")
    print("OK: %gpumem fit from a session that never asked to record")


if __name__ == "__main__":
    main()
