"""gpumem-nb in the stock evcxr Jupyter kernel (kernel `rust`), through jupyter_client/nbclient.

Usage: python3 tests/stock_nbclient.py REPO [OUT_DIR]   (tests/stock_kernel.sh sets it up: the
pinned evcxr_jupyter, its kernelspec in a private JUPYTER_PATH, GPUMEM_NB_DEVICE=sim:8GiB, the
packaged crate in a local registry and STOCK_DEP, the `:dep` line that loads it)

Runs a notebook that loads the crate with `:dep`, and checks every cell: from the cell after the
first use of the crate, a report line as the last stdout line, with exact numbers (a 64 MiB
allocation is +64.00 MiB; a temporary shows in the peak only), the record beside a value or an
HTML table without changing them, a panic reported, `set_reports(false)`, and after the child
crashes and after `:restart`, the hooks back by themselves from the next use on; what a
framework's own thread allocates after the cell's code returned counted in that cell; a kernel's
fault (injected on the simulated device) named on the line and, once, above it on stdout (stderr
is another pipe, which evcxr may forward after the cell ended). The cells' own
outputs are compared whole, with the report line taken out.
"""

import json
import os
import re
import sys
import tempfile

import nbformat
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

CELL_MIME = "application/vnd.gpumem.cell+json"
REPORT = re.compile(r"^\[(\d+)\] sim · ")
TABLE = "<table><tr><th>n</th></tr><tr><td>1</td></tr></table>"


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def cell(code, stdout=(), report=None, result=None, error=False, stderr=(), notice=()):
    """One cell: its own stdout lines, its report's required parts (None: no report), its own
    execute_result data, whether it ends in an error (None: either), what its stderr must say, what
    the notice above the report line must say (its lines are then not the cell's own)."""
    return {"code": code, "stdout": list(stdout), "report": report, "result": result, "error": error,
            "stderr": list(stderr), "notice": list(notice)}


def plan(repo):
    alloc = "gpumem_nb::DeviceBuffer::<u8>::alloc(&alloc, {} << 20, gpumem_nb::StreamId::DEFAULT).unwrap()"
    return [
        # tests/stock_kernel.sh: the packaged crate from a local registry (`= "0.1"`); by hand,
        # the checkout itself.
        cell(os.environ.get("STOCK_DEP") or ":dep gpumem-nb = { path = %s }" % json.dumps(repo)),
        # The first use installs the hooks: reports from the next cell on.
        cell("let alloc = gpumem_nb::current().unwrap();\nalloc.backend_kind()", result={"text/plain": "Simulated"}),
        cell(f"let big = {alloc.format(64)};",
             report=["allocated 64.0 MiB (+64.0 MiB)",
                     "reserved 64.0 MiB (+64.0 MiB)",
                     # The cell's own code holds it (its body, no line: the stock kernel builds
                     # cells without line tables), not evcxr's runtime that called it.
                     "top cell 3", "free 7.94 GiB"]),
        # A temporary: in the peak only (its segment stays cached: reserved, so allocated by the driver).
        cell(f"drop({alloc.format(32)});\nprintln!(\"temporary freed\");", stdout=["temporary freed"],
             report=["allocated 64.0 MiB (peak 96.0 MiB)",
                     "reserved 96.0 MiB (+32.0 MiB)"]),
        cell('println!("before the panic");\npanic!("boom");', stdout=["before the panic"],
             report=["allocated 64.0 MiB (±0 B)"]),
        cell("big.len()", result={"text/plain": str(64 << 20)}, report=["allocated 64.0 MiB (±0 B)"]),
        cell("struct Table;\nimpl Table {\n    fn evcxr_display(&self) {\n"
             f'        println!("EVCXR_BEGIN_CONTENT text/html\\n{TABLE}\\nEVCXR_END_CONTENT");\n'
             "    }\n}\nTable", result={"text/html": TABLE}, report=["allocated 64.0 MiB (±0 B)"]),
        cell("gpumem_nb::kernel::set_reports(false);"),
        cell(f"let more = {alloc.format(8)};"),
        # Back on: from the cell after this one.
        cell("gpumem_nb::kernel::set_reports(true);"),
        cell(f"let more2 = {alloc.format(8)};", report=["allocated 80.0 MiB (+8.00 MiB)"]),
        # The child dies (variables lost); the next use of the crate installs the hooks again.
        cell("std::process::abort();", error=True),
        cell("let alloc = gpumem_nb::current().unwrap();\nlet first = " + alloc.format(16) + ";"),
        # 8 MiB sits in a 20 MiB segment (PyTorch's rule for 1-10 MiB requests).
        cell(f"let second = {alloc.format(8)};",
             report=["reserved 36.0 MiB (+20.0 MiB)",
                     "allocated 24.0 MiB (+8.00 MiB)"]),
        cell(":restart", result={"text/plain": "Child process restarted\n"}),
        # evcxr 0.22 alone: the first cell after `:restart` asks the new child for the old
        # variables and aborts it ("Variable 'second' has gone missing"); then it is clean.
        cell("1", result=None, error=None),
        cell("let alloc = gpumem_nb::current().unwrap();\nlet third = " + alloc.format(4) + ";"),
        cell(f"let fourth = {alloc.format(4)};", report=["allocated 8.00 MiB (+4.00 MiB)"]),
        # A framework's device thread (the simulated one, batched as cubecl's): what the cell
        # queued runs after its code returned, and lands in that cell (the reading settles the
        # queue first); 20 MiB reserved + 36 MiB from the driver.
        cell("let q = gpumem_nb::frameworks::SimQueue::start(\"model\", 32).unwrap();\nq.watch().unwrap();",
             report=[]),
        cell("q.alloc_later(20);\nq.alloc_later(16);\nassert_eq!(q.held(), 0);",
             report=["simqueue in use 36.00 MiB (+36.00 MiB, cached 0 B)"]),
        # Component stamps are phases of a watched framework: its books at each stamp's ends,
        # the nested stamp's change its own, the outer one's the rest.
        cell("gpumem_nb::component(gpumem_nb::Component::Parameter, || {\n"
             "    q.alloc_later(24);\n"
             "    gpumem_nb::component(gpumem_nb::Component::OptimizerState, || q.alloc_later(48));\n"
             "});",
             report=["simqueue in use 108.00 MiB (+72.00 MiB, cached 0 B)"]),
        # A kernel's fault (injected: the simulated device's next copy faults): the report says
        # the context is lost instead of numbers, stderr says why once and leaves the restart
        # to the user (the stock kernel has no restart of its own), on stdout above the line.
        cell("alloc.with_backend(|b| b.as_sim_mut().map(|s| s.inject_fault(gpumem_nb::device::Fault::IllegalAddress)));\n"
             "let back = fourth.to_host();",
             report=["✗ CUDA context lost (illegal address): host code runs"],
             notice=["CUDA_ERROR_ILLEGAL_ADDRESS: the CUDA context of this notebook's process is lost (illegal "
                     "address), first reported by cuMemcpyDtoHAsync_v2 in cell", "CUDA_LAUNCH_BLOCKING=1",
                     "Restart the kernel to go on"]),
    ]


def main():
    repo = os.path.abspath(sys.argv[1])
    out_dir = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else tempfile.mkdtemp()
    os.makedirs(out_dir, exist_ok=True)
    cells = plan(repo)
    nb = new_notebook(cells=[new_code_cell(c["code"]) for c in cells])
    client = NotebookClient(nb, kernel_name="rust", timeout=1800, startup_timeout=600, allow_errors=True)
    client.execute()
    out_nb = os.path.join(out_dir, "stock.executed.ipynb")
    nbformat.write(nb, out_nb)
    print("executed notebook:", out_nb)

    runs = []
    for i, (got, want) in enumerate(zip(nb.cells, cells)):
        where = f"cell {i + 1} ({want['code'].splitlines()[0][:40]!r})"
        outs = got.outputs
        lines = "".join(o.text for o in outs if o.output_type == "stream" and o.name == "stdout").splitlines()
        reports = [l for l in lines if REPORT.match(l)]
        if want["notice"]:
            above = "\n".join(lines[len(want["stdout"]):-1])
            for part in want["notice"]:
                if part not in above:
                    fail(f"{where}: {part!r} not above the report line: {lines!r}")
            lines = lines[:len(want["stdout"])] + lines[-1:]
        if [l for l in lines if not REPORT.match(l)] != want["stdout"]:
            fail(f"{where}: own stdout {lines!r}, expected {want['stdout']!r}")
        if want["report"] is None:
            if reports:
                fail(f"{where}: unexpected report {reports}")
        else:
            if len(reports) != 1 or lines[-1] != reports[0]:
                fail(f"{where}: expected one report as the last stdout line, got {lines!r}")
            if any(f" · top {internal}" in reports[0] for internal in ("evcxr::", "load_and_run")):
                fail(f"{where}: the top site is evcxr's, not the notebook's: {reports[0]!r}")
            for part in want["report"]:
                if f" · {part} · " not in reports[0] + " · ":
                    fail(f"{where}: {part!r} not in {reports[0]!r}")
            runs.append(int(REPORT.match(reports[0]).group(1)))
        stderr = "".join(o.text for o in outs if o.output_type == "stream" and o.name == "stderr")
        for part in want["stderr"]:
            if part not in stderr:
                fail(f"{where}: {part!r} not on stderr: {stderr!r}")
        errors = [o for o in outs if o.output_type == "error"]
        if want["error"] is not None and bool(errors) != want["error"]:
            fail(f"{where}: errors {[(e.ename, e.evalue) for e in errors]}")
        if errors and want["error"] is None:
            continue
        # The cell's own result, intact; the record beside it, and only there.
        results = [o.data for o in outs if o.output_type == "execute_result"]
        data = results[0] if results else None
        own = {k: v for k, v in data.items() if k != CELL_MIME} if data else None
        if len(results) > 1 or own != want["result"]:
            fail(f"{where}: result {results!r}, expected {want['result']!r}")
        rec = data.get(CELL_MIME) if data else None
        if (rec is not None) != (want["result"] is not None and want["report"] is not None):
            fail(f"{where}: record {rec!r}")
        if rec is not None:
            if f"[{rec['cell']}] " + reports[0].split("] ", 1)[1] != reports[0] or rec["status"] != "ok":
                fail(f"{where}: record {rec!r} does not match its line {reports[0]!r}")
            if rec["allocator"]["allocated"]["after"] != 64 << 20:
                fail(f"{where}: record numbers {rec['allocator']}")
        if i == 4:
            stderr = "".join(o.text for o in outs if o.output_type == "stream" and o.name == "stderr")
            if "boom" not in stderr:
                fail(f"{where}: the panic's own message is missing: {outs!r}")
    if runs != sorted(set(runs)):
        fail(f"report numbers not increasing: {runs}")
    print(f"OK: {len(runs)} per-cell reports in the stock kernel, numbers exact, own outputs intact; runs {runs}")


if __name__ == "__main__":
    main()
