"""A real Prometheus scrapes the gpumem kernel while a notebook runs; what it stored must equal the
cells' own records.

Usage: python3 kernel/tests/prometheus_check.py PATH/TO/gpumem-kernel OUT_DIR

Starts the kernel (through jupyter_client/nbclient, kernelspec in a private prefix) with
GPUMEM_NB_METRICS on a free loopback port, RANK=3 and the simulated device; starts `prometheus`
scraping it every second; runs a few cells that allocate, free, take a temporary, hold driver
memory and panic, each sleeping long enough to be scraped. Then, through Prometheus's HTTP API
(/api/v1/query_range and /api/v1/query), for every cell whose record Prometheus saw as the latest
(`gpumem_cell`): the usage, reserved, peak and limit series equal the record's numbers, labelled
hw_id="sim-0", pid=the record's child pid, rank="3"; at the end the counters equal the cells'
statuses. Also checks the endpoint's content type and `# EOF`, and that Prometheus's last scrape
succeeded (`up` is 1). Prometheus and the kernel are stopped on the way out.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import prometheus_server  # noqa: E402

CELL_MIME = "application/vnd.gpumem.cell+json"
SLEEP = "std::thread::sleep(std::time::Duration::from_millis(2500));"
CELLS = [
    ":dep gpumem-nb",
    "use gpumem_nb::{DeviceBuffer, StreamId};\nlet alloc = gpumem_nb::current()?;\n"
    "let a = DeviceBuffer::<u8>::zeros(&alloc, 64 << 20, StreamId::DEFAULT)?;\n" + SLEEP,
    "let b = DeviceBuffer::<u8>::zeros(&alloc, 96 << 20, StreamId::DEFAULT)?;\n"
    "{ let _t = DeviceBuffer::<u8>::zeros(&alloc, 200 << 20, StreamId::DEFAULT)?; }\n" + SLEEP,
    "drop(a);\nlet d = gpumem_nb::mem::driver_alloc_mib(8)?;\n" + SLEEP,
    SLEEP + '\npanic!("on purpose");',
    # After the panic the child may be a new one: nothing from before is assumed.
    "let c = gpumem_nb::DeviceBuffer::<u8>::zeros(&gpumem_nb::current()?, 2 << 20, gpumem_nb::StreamId::DEFAULT)?;\n"
    + SLEEP,
    SLEEP,
]


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(prom, path, **params):
    url = f"http://{prom}/api/v1/{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        fail(f"Prometheus {path} {params}: {body}")
    return body["data"]["result"]


def expected(rec):
    """(metric, source) -> value, as the record has it."""
    a = rec.get("allocator") or {}
    all_ = rec.get("all_allocations") or {}
    want = {
        ("hw_gpu_memory_usage_bytes", "allocator"): a.get("allocated", {}).get("after"),
        ("gpumem_reserved_bytes", "allocator"): a.get("reserved", {}).get("after"),
        ("gpumem_cell_peak_bytes", "allocator"): a.get("peak_allocated"),
        ("gpumem_cell_peak_reserved_bytes", "allocator"): a.get("peak_reserved"),
        ("hw_gpu_memory_usage_bytes", "tracked"): all_.get("after"),
        ("gpumem_cell_peak_bytes", "tracked"): all_.get("peak"),
        ("hw_gpu_memory_limit_bytes", None): rec.get("crate_device_total"),
    }
    return {k: v for k, v in want.items() if v is not None}


def main():
    kernel_bin = os.path.abspath(sys.argv[1])
    out = os.path.abspath(sys.argv[2])
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    prefix = tempfile.mkdtemp(prefix="gpumem-kernelspec-")
    subprocess.check_call([kernel_bin, "install", "--prefix", prefix, "--no-prebuild"], stdout=subprocess.DEVNULL)
    os.environ["JUPYTER_PATH"] = os.path.join(prefix, "share", "jupyter")
    metrics_port, prom_port = free_port(), free_port()
    endpoint = f"127.0.0.1:{metrics_port}"
    prom = f"127.0.0.1:{prom_port}"
    os.environ.update(GPUMEM_NB_METRICS=endpoint, GPUMEM_NB_DEVICE="sim:8GiB", RANK="3")
    os.environ.pop("LOCAL_RANK", None)

    config = os.path.join(out, "prometheus.yml")
    with open(config, "w") as f:
        f.write(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            f"scrape_configs:\n  - job_name: gpumem\n    static_configs:\n      - targets: ['{endpoint}']\n"
        )
    try:
        with prometheus_server.running(config, out, prom, fail):
            check(prom, endpoint, out)
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def check(prom, endpoint, out):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    client = NotebookClient(nb, kernel_name="gpumem", timeout=900, startup_timeout=300, allow_errors=True)
    start = time.time()
    with client.setup_kernel():
        # The endpoint itself: OpenMetrics, served from the kernel before any cell ran.
        client.execute_cell(nb.cells[0], 0)  # the engine (and its endpoint) runs by now
        for _ in range(50):
            try:
                with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as r:
                    ctype = r.headers["Content-Type"]
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        else:
            fail(f"the kernel's endpoint {endpoint} did not answer")
        if not ctype.startswith("application/openmetrics-text; version=1.0.0"):
            fail(f"content type {ctype!r}")
        if not body.endswith("# EOF\n"):
            fail(f"no # EOF at the end: {body[-200:]!r}")
        for i, cell in enumerate(nb.cells[1:], 1):
            client.execute_cell(cell, i)
        time.sleep(3)  # the last cell's record is scraped too
        end = time.time()
        nbformat.write(nb, os.path.join(out, "prometheus.executed.ipynb"))
        records = []
        for cell in nb.cells:
            recs = [o.data[CELL_MIME] for o in cell.outputs if o.output_type == "display_data" and CELL_MIME in o.data]
            if len(recs) != 1:
                fail(f"cell {cell.source[:30]!r}: {len(recs)} records")
            records.append(recs[0])
        statuses = [r["status"] for r in records]
        if "panicked" not in statuses or statuses.count("ok") < 5:
            fail(f"statuses {statuses}")

        host = open("/proc/sys/kernel/hostname").read().strip()
        # Which record was the latest, scrape by scrape.
        rng = dict(start=f"{start:.3f}", end=f"{end:.3f}", step="0.25")
        cell_series = api(prom, "query_range", query='gpumem_cell{job="gpumem"}', **rng)
        if len(cell_series) != 1:
            fail(f"gpumem_cell: {cell_series}")
        latest_at = {float(t): int(float(v)) for t, v in cell_series[0]["values"]}
        seen = set(latest_at.values())
        by_cell = {r["cell"]: r for r in records}
        # Every cell's record was the latest for at least one scrape (each following cell sleeps).
        missing = sorted(set(by_cell) - seen)
        if missing:
            fail(f"cells never seen by Prometheus: {missing} (seen {sorted(seen)})")
        compared = 0
        metrics = sorted({m for r in records for (m, _) in expected(r)})
        for metric in metrics:
            for series in api(prom, "query_range", query=f'{metric}{{job="gpumem"}}', **rng):
                labels = series["metric"]
                source = labels.get("source")
                if labels.get("hw_id") != "sim-0" or labels.get("hw_type") != "gpu":
                    fail(f"{metric}: device labels {labels}")
                if labels.get("rank") != "3" or labels.get("host") != host:
                    fail(f"{metric}: rank/host labels {labels} (host {host})")
                for t, v in series["values"]:
                    cell = latest_at.get(float(t))
                    if cell is None:
                        continue
                    rec = by_cell[cell]
                    if labels.get("pid") != str(rec["child_pid"]):
                        continue  # an earlier child's series, stale here
                    want = expected(rec).get((metric, source))
                    if want is None:
                        continue
                    if int(float(v)) != want:
                        fail(f"{metric}{{source={source}}} at cell {cell}: Prometheus {v}, record {want}")
                    compared += 1
        # The counters, now.
        ok_now = api(prom, "query", query='gpumem_cells_total{job="gpumem",status="ok"}')
        panicked_now = api(prom, "query", query='gpumem_cells_total{job="gpumem",status="panicked"}')
        up = api(prom, "query", query='up{job="gpumem"}')
    if int(float(ok_now[0]["value"][1])) != statuses.count("ok"):
        fail(f"gpumem_cells_total{{status=ok}} {ok_now} != {statuses.count('ok')}")
    if int(float(panicked_now[0]["value"][1])) != statuses.count("panicked"):
        fail(f"gpumem_cells_total{{status=panicked}} {panicked_now}")
    if up[0]["value"][1] != "1":
        fail(f"up {up}")
    if compared < 3 * len(records):
        fail(f"only {compared} values compared")
    print(
        f"OK: {len(records)} cells, {compared} values read back from Prometheus equal the records "
        f"(statuses {statuses}), counters equal, endpoint {endpoint} scraped by Prometheus at {prom}"
    )


if __name__ == "__main__":
    main()
