"""A cell's worker process on the (simulated) device shows in its report.

Usage: python3 kernel/tests/children_check.py PATH/TO/gpumem-kernel PATH/TO/gpumem-demo

Runs, through jupyter_client/nbclient on the simulated device: a cell that allocates 64 MiB in
the notebook; a cell that starts `gpumem-demo hold 48MiB 120` (a second process with gpumem-nb
on the simulated device) and waits for its first line; a cell that stops it. Checks: the second
cell's record lists exactly that worker (pid as the cell printed it, name `gpumem-demo`, 48 MiB,
source `simulated`, device `sim-0`, no rank: it was given none) and its line says so, while the
notebook's own allocator numbers did not move; where the live line read the device during the
cell (a cell over a second), the worker's highest reading is its 48 MiB. The third cell's record
lists no child, or (read during the cell, before the worker stopped) the worker with 0 bytes at
the end and its highest reading, 48 MiB.
"""

import os
import shutil
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
    kernel_bin, demo = (os.path.abspath(p) for p in sys.argv[1:3])
    prefix = tempfile.mkdtemp(prefix="gpumem-kernelspec-")
    table = tempfile.mkdtemp(prefix="gpumem-sim-procs-")
    try:
        subprocess.check_call([kernel_bin, "install", "--prefix", prefix, "--no-prebuild"], stdout=subprocess.DEVNULL)
        os.environ.update(
            JUPYTER_PATH=os.path.join(prefix, "share", "jupyter"),
            GPUMEM_NB_DEVICE="sim:8GiB",
            GPUMEM_NB_SIM_PROCS=table,
            GPUMEM_DEMO=demo,
        )
        for v in ("RANK", "LOCAL_RANK", "GPUMEM_NB_METRICS"):
            os.environ.pop(v, None)
        run()
    finally:
        shutil.rmtree(prefix, ignore_errors=True)
        shutil.rmtree(table, ignore_errors=True)


def run():
    cells = [
        ":dep gpumem-nb\nlet alloc = gpumem_nb::current()?;\n"
        "let a = gpumem_nb::DeviceBuffer::<u8>::zeros(&alloc, 64 << 20, gpumem_nb::StreamId::DEFAULT)?;",
        "use std::io::BufRead;\n"
        'let mut worker = std::process::Command::new(std::env::var("GPUMEM_DEMO")?)\n'
        '    .args(["hold", "48MiB", "120"]).stdout(std::process::Stdio::piped()).spawn()?;\n'
        "let mut first = String::new();\n"
        "std::io::BufReader::new(worker.stdout.take().unwrap()).read_line(&mut first)?;\n"
        'println!("worker {} {}", worker.id(), first.trim());',
        "worker.kill()?;\nworker.wait()?;",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    NotebookClient(nb, kernel_name="gpumem", timeout=900, startup_timeout=300).execute()
    recs = []
    for cell in nb.cells:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if errors:
            fail(f"{cell.source[:40]!r}: {errors[0].ename}: {errors[0].evalue}")
        r = [o.data[CELL_MIME] for o in cell.outputs if o.output_type == "display_data" and CELL_MIME in o.data]
        if len(r) != 1:
            fail(f"{cell.source[:40]!r}: {len(r)} records")
        recs.append(r[0])
    printed = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.output_type == "stream")
    words = printed.split()
    if len(words) < 3 or words[0] != "worker" or words[2] != "holding":
        fail(f"the worker's first line: {printed!r}")
    pid = int(words[1])
    rows = recs[1].get("children", [])
    want = {"pid": pid, "name": "gpumem-demo", "device": "sim-0", "used": 48 << 20, "source": "simulated"}
    # The live line's readings during a long cell add the worker's highest reading and their count.
    sampled = {"peak": 48 << 20, "readings": rows[0].get("readings")} if rows and "peak" in rows[0] else {}
    if rows != [dict(want, **sampled)] or (sampled and not sampled["readings"] >= 2):
        fail(f"children of the cell that started the worker: {rows}, expected {[want]} (and its highest reading)")
    a0, a1 = recs[0]["allocator"]["allocated"]["after"], recs[1]["allocator"]["allocated"]["after"]
    if a0 != 64 << 20 or a1 != a0:
        fail(f"the notebook's own allocated bytes moved with the worker: {a0} -> {a1}")
    stopped = recs[2].get("children", [])
    if stopped and not (
        len(stopped) == 1 and stopped[0]["pid"] == pid and stopped[0]["used"] == 0 and stopped[0].get("peak") == 48 << 20
    ):
        fail(f"the stopped worker is listed as holding memory: {stopped}")
    text = "".join(
        o.data.get("text/plain", "") for o in nb.cells[1].outputs if o.output_type == "display_data" and CELL_MIME in o.data
    )
    if f"child processes 48.0 MiB (gpumem-demo {pid})" not in text:
        fail(f"the report line does not name the worker: {text[:400]!r}")
    html = "".join(
        o.data.get("text/html", "") for o in nb.cells[1].outputs if o.output_type == "display_data" and CELL_MIME in o.data
    )
    if f"child process gpumem-demo (pid {pid}) on sim-0" not in html or "simulated device&#39;s process table" not in html:
        fail(f"the details table does not list the worker with its source: {html[:600]!r}")
    read = f", the highest of {sampled['readings']} readings" if sampled else ", read at the end of the cell"
    gone = "listed at 0 B with its highest reading" if stopped else "not listed"
    print(
        f"OK: the worker (pid {pid}, gpumem-demo, 48 MiB on sim-0{read}) is in its cell's report, apart from the "
        f"notebook's own 64 MiB; after it stopped: {gone}"
    )


if __name__ == "__main__":
    main()
