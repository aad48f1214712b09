"""The Slurm recipe's scrape against a real Prometheus, two ranks on this host.

Usage: python3 deploy/slurm/check.py PATH/TO/train_rank OUT_DIR [--sbatch]

Starts `prometheus` with the recipe's prometheus.yml, the file_sd path alone replaced by
OUT_DIR/targets, then a job of two ranks on this host, on the simulated device, on loopback; each
rank writes its steps' records (`--records`), the numbers it served. The job:
- by default, as train.sbatch runs one without Slurm: the targets written by the recipe's
  targets.sh (with the variables sbatch sets: one node, two tasks on it), two ranks started
  through the recipe's rank.sh with what srun sets for each task (SLURM_PROCID, SLURM_LOCALID,
  SLURM_JOB_ID, SLURM_NTASKS, ...);
- with --sbatch, train.sbatch itself through a running Slurm (SLURM_CONF; local_slurm.sh starts
  one): `sbatch --wait`, the batch script writing the targets file and removing it at the end.

Then, through Prometheus's HTTP API, with every sample Prometheus stored:
- both targets were scraped (`up` 1) at the addresses targets.sh gave;
- every gpumem series of both ranks has exactly the bounded label set (job, slurm_job_id, rank,
  host, hw_id and the metric's own source/component/status; no pid, no instance);
- every value equals the rank's own record of the step it was serving at that scrape (the
  scrape's gpumem_cell), the counters the sums over its records;
- every PromQL expression of grafana/gpumem.json, with the dashboard's variables set to this job
  and all ranks, returns series for both ranks.
The label and value checks are also run on stored series altered on purpose (a rank label gone,
a pid kept, a value off by one): each must be caught, so the checks can fail.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import prometheus_server  # noqa: E402

RECIPE = os.path.dirname(os.path.abspath(__file__))
JOB_ID = "7301"
RANKS = [0, 1]
STEPS, STEP_MS, LINGER = 30, 700, 7

# The labels a series keeps after prometheus.yml's labelkeep: the identity, then the metric's own.
IDENTITY = {"__name__", "job", "slurm_job_id", "rank", "host"}
DEVICE = IDENTITY | {"hw_id"}
LABELS = {
    "hw_gpu_memory_usage_bytes": DEVICE | {"source"},
    "gpumem_reserved_bytes": DEVICE | {"source"},
    "gpumem_cell_peak_bytes": DEVICE | {"source"},
    "gpumem_cell_peak_reserved_bytes": DEVICE | {"source"},
    "gpumem_component_bytes": DEVICE | {"component"},
    "hw_gpu_memory_limit_bytes": DEVICE,
    "gpumem_cell": IDENTITY,
    "gpumem_cells_total": IDENTITY | {"status"},
    "gpumem_restarts_total": IDENTITY,
    "gpumem_ooms_total": IDENTITY,
    "gpumem_hook_microseconds_total": IDENTITY,
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def free_port(pair=False):
    """A free loopback port (with `pair`, one whose next port is free too)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not pair or port >= 65535:
            return port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    fail("no free pair of ports")


def api(prom, path, **params):
    url = f"http://{prom}/api/v1/{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        fail(f"Prometheus {path} {params}: {body}")
    return body["data"]


def expected(rec, name, labels):
    """The value a record gives the series `name{labels}` (as metrics.rs renders it), or None."""
    a = rec.get("allocator") or {}
    all_ = rec.get("all_allocations") or {}
    tracked = all_.get("after") is not None
    source = labels.get("source")
    table = {
        ("hw_gpu_memory_usage_bytes", "allocator"): (a.get("allocated") or {}).get("after"),
        ("hw_gpu_memory_usage_bytes", "pool"): ((rec.get("pool") or {}).get("used") or {}).get("after"),
        ("hw_gpu_memory_usage_bytes", "tracked"): all_.get("after") if tracked else None,
        ("hw_gpu_memory_usage_bytes", "process"): (rec.get("nvml") or {}).get("process", {}).get("after"),
        ("gpumem_reserved_bytes", "allocator"): (a.get("reserved") or {}).get("after"),
        ("gpumem_cell_peak_bytes", "allocator"): a.get("peak_allocated"),
        ("gpumem_cell_peak_bytes", "tracked"): all_.get("peak") if tracked else None,
        ("gpumem_cell_peak_reserved_bytes", "allocator"): a.get("peak_reserved"),
        ("hw_gpu_memory_limit_bytes", None): rec.get("crate_device_total"),
        ("gpumem_cell", None): rec["cell"],
    }
    if name == "gpumem_component_bytes":
        parts = {c["component"]: c["after"] for c in all_.get("by_component", [])}
        return parts.get(labels.get("component"))
    return table.get((name, source))


def counter(records, step, name, labels):
    """A counter's value while `step` was the latest (0: before the first step ended)."""
    done = [r for r in records.values() if r["cell"] <= step]
    if name == "gpumem_cells_total":
        return sum(1 for r in done if r["status"] == labels.get("status"))
    if name == "gpumem_hook_microseconds_total":
        return sum(r["hook_us"] for r in done)
    return 0  # restarts, ooms: none in this run


def check_labels(series, host):
    """Problems with the stored series' label sets and identities."""
    problems = []
    ranks_of = {}
    for s in series:
        m = s["metric"]
        name = m["__name__"]
        want = LABELS.get(name)
        if want is None:
            problems.append(f"unexpected series {m}")
            continue
        if set(m) != want:
            problems.append(f"{name}: labels {sorted(m)}, expected exactly {sorted(want)}")
            continue
        if m["slurm_job_id"] != JOB_ID or m["host"] != host or m["job"] != "gpumem":
            problems.append(f"{name}: identity {m} (job {JOB_ID}, host {host})")
        if "hw_id" in m and m["hw_id"] != "sim-0":
            problems.append(f"{name}: hw_id {m['hw_id']}")
        ranks_of.setdefault(name, set()).add(m["rank"])
    for name in LABELS:
        if ranks_of.get(name) != {str(r) for r in RANKS}:
            problems.append(f"{name}: series of ranks {sorted(ranks_of.get(name, []))}, expected {RANKS}")
    return problems


def check_values(series, records_by_rank):
    """Problems with the stored values against each rank's records; and how many were compared."""
    problems, compared = [], 0
    # Which step each rank served at each scrape: a scrape stores every series of a target at one
    # timestamp, gpumem_cell among them.
    step_at = {}
    for s in series:
        if s["metric"]["__name__"] == "gpumem_cell":
            for t, v in s["values"]:
                step_at[(s["metric"]["rank"], t)] = int(v)
    for s in series:
        m = s["metric"]
        name, rank = m["__name__"], m["rank"]
        records = records_by_rank[int(rank)]
        for t, v in s["values"]:
            step = step_at.get((rank, t), 0)
            if name.endswith("_total"):
                want = counter(records, step, name, m)
            elif step == 0:
                problems.append(f"{name}{m} at {t}: a gauge in a scrape with no step")
                continue
            elif step not in records:
                problems.append(f"{name}{m} at {t}: step {step}, which the rank never recorded")
                continue
            else:
                want = expected(records[step], name, m)
            if want is None:
                problems.append(f"{name}{m} at {t}: stored {v}, but step {step}'s record has no such value")
            elif int(v) != want:
                problems.append(f"{name}{m} at {t} (step {step}): Prometheus {v}, the rank's record {want}")
            compared += 1
    return problems, compared


def dashboard_queries():
    """Every PromQL expression of the Grafana dashboard, with its variables set as Grafana would
    for this job and all ranks."""
    with open(os.path.join(RECIPE, "grafana", "gpumem.json")) as f:
        dash = json.load(f)
    all_rank = next(v["allValue"] for v in dash["templating"]["list"] if v["name"] == "rank")
    exprs = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                exprs.append((p["title"], t["expr"]))

    walk(dash["panels"])
    values = {"slurm_job_id": JOB_ID, "rank": all_rank, "__range": "10m", "__rate_interval": "1m", "__interval": "5s"}
    out = []
    for title, expr in exprs:
        q = re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), m.group(0)), expr)
        if "$" in q:
            fail(f"dashboard panel {title!r}: a variable the check does not know: {expr}")
        out.append((title, q))
    if len(out) < 5:
        fail(f"the dashboard has {len(out)} expressions")
    return out


def start_ranks(binary, base, out, env):
    procs = []
    for r in RANKS:
        e = dict(env)
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            e.pop(k, None)
        # What srun sets for task r of a two-task job on one node.
        e.update(
            SLURM_JOB_ID=JOB_ID, SLURM_JOBID=JOB_ID, SLURM_PROCID=str(r), SLURM_LOCALID=str(r),
            SLURM_NODEID="0", SLURM_NTASKS="2", SLURM_NPROCS="2", SLURM_NNODES="1",
            SLURM_JOB_NODELIST="127.0.0.1", SLURM_TASKS_PER_NODE="2",
            GPUMEM_TRAIN_BIN=binary, GPUMEM_METRICS_LISTEN="127.0.0.1", GPUMEM_METRICS_PORT=str(base),
            GPUMEM_NB_DEVICE="sim:16GiB",
        )
        log = open(os.path.join(out, f"rank{r}.log"), "w")
        procs.append(subprocess.Popen([os.path.join(RECIPE, "rank.sh"), *train_args(out)], env=e, stdout=log,
                                      stderr=subprocess.STDOUT))
    return procs


def train_args(out):
    return ["--steps", str(STEPS), "--step-ms", str(STEP_MS), "--linger", str(LINGER),
            "--records", os.path.join(out, "records"), "--every", "5"]


def run_direct(binary, base, out):
    """The job as train.sbatch runs it, without Slurm: targets.sh's file, then rank.sh twice."""
    env = dict(os.environ, SLURM_JOB_ID=JOB_ID, SLURM_JOB_NODELIST="127.0.0.1", SLURM_TASKS_PER_NODE="2",
               GPUMEM_METRICS_PORT=str(base))
    targets = subprocess.run([os.path.join(RECIPE, "targets.sh")], env=env, check=True, capture_output=True,
                             text=True).stdout
    with open(os.path.join(out, "targets", f"gpumem-{JOB_ID}.json"), "w") as f:
        f.write(targets)
    procs = start_ranks(binary, base, out, dict(os.environ))
    try:
        for r, p in zip(RANKS, procs):
            if p.wait(timeout=300) != 0:
                fail(f"rank {r} exited with {p.returncode}: {open(os.path.join(out, f'rank{r}.log')).read()[-2000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return "127.0.0.1"


def run_sbatch(binary, base, out):
    """The job through Slurm: train.sbatch submitted from the repository's root, waited for."""
    global JOB_ID
    env = dict(os.environ, GPUMEM_TRAIN_BIN=binary, GPUMEM_METRICS_LISTEN="127.0.0.1",
               GPUMEM_METRICS_PORT=str(base), GPUMEM_TARGETS_DIR=os.path.join(out, "targets"),
               GPUMEM_NB_DEVICE="sim:16GiB")
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(k, None)
    # Two tasks of one CPU each: this machine may have only two.
    cmd = ["sbatch", "--parsable", "--wait", "--cpus-per-task=1", f"--output={out}/slurm-%j.out",
           os.path.join(RECIPE, "train.sbatch"), *train_args(out)]
    sbatch = subprocess.Popen(cmd, env=env, cwd=os.path.dirname(os.path.dirname(RECIPE)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    # --parsable prints the job's id as it is submitted; --wait returns when the job has ended.
    JOB_ID = sbatch.stdout.readline().strip().split(";")[0]
    try:
        code = sbatch.wait(timeout=300)
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", JOB_ID])
        sbatch.kill()
        fail(f"job {JOB_ID} still running after 300 s: cancelled")
    log = os.path.join(out, f"slurm-{JOB_ID}.out")
    text = open(log).read() if os.path.exists(log) else "(no output file)"
    if code != 0 or not JOB_ID.isdigit():
        fail(f"sbatch: exit {code}, job {JOB_ID!r}, {sbatch.stderr.read()!r}\n{text[-2000:]}")
    for r in RANKS:
        if f"rank {r} (local {r}, Slurm job {JOB_ID})" not in text:
            fail(f"the job's output does not show rank {r} of job {JOB_ID}:\n{text[-2000:]}")
    left = os.listdir(os.path.join(out, "targets"))
    if left:
        fail(f"the batch script left its targets behind: {left}")
    return "localhost"


def main():
    binary, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    through_slurm = sys.argv[3:] == ["--sbatch"]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "targets"))
    host = open("/proc/sys/kernel/hostname").read().strip()
    base, prom_port = free_port(pair=True), free_port()
    prom = f"127.0.0.1:{prom_port}"
    # The recipe's configuration, its file_sd path alone replaced.
    with open(os.path.join(RECIPE, "prometheus.yml")) as f:
        config = f.read()
    recipe_glob = "/srv/prometheus/gpumem-targets/*.json"
    if config.count(recipe_glob) != 1:
        fail(f"prometheus.yml no longer reads its targets from {recipe_glob}")
    config_path = os.path.join(out, "prometheus.yml")
    with open(config_path, "w") as f:
        f.write(config.replace(recipe_glob, os.path.join(out, "targets", "*.json")))

    with prometheus_server.running(config_path, out, prom, fail):
        start = time.time()
        node = (run_sbatch if through_slurm else run_direct)(binary, base, out)
        check(prom, host, node, base, out, start, "sbatch" if through_slurm else "srun's variables")


def check(prom, host, node, base, out, start, how):
    records_by_rank = {}
    for r in RANKS:
        with open(os.path.join(out, "records", f"rank{r}.jsonl")) as f:
            recs = [json.loads(line) for line in f]
        if [x["cell"] for x in recs] != list(range(1, STEPS + 1)):
            fail(f"rank {r}: records of steps {[x['cell'] for x in recs]}")
        records_by_rank[r] = {x["cell"]: x for x in recs}
    if records_by_rank[0][STEPS]["allocator"]["peak_allocated"] == records_by_rank[1][STEPS]["allocator"]["peak_allocated"] \
            and all(records_by_rank[0][s]["allocator"]["peak_allocated"] == records_by_rank[1][s]["allocator"]["peak_allocated"]
                    for s in range(1, STEPS + 1)):
        fail("the two ranks' peaks are equal at every step: a mix-up of ranks would go unseen")

    window = f"{int(time.time() - start) + 30}s"
    now = f"{time.time():.3f}"
    # The targets file_sd found (the file is gone once a job through Slurm has ended; `up` stays):
    # each scraped with success.
    up = api(prom, "query", query=f'max_over_time(up{{job="gpumem"}}[{window}])', time=now)["result"]
    addresses = sorted((u["metric"]["instance"], u["value"][1]) for u in up)
    if addresses != [(f"{node}:{base}", "1"), (f"{node}:{base + 1}", "1")]:
        fail(f"targets scraped (instance, up): {addresses}, expected {node}:{base} and {node}:{base + 1} up")

    # Every sample of every gpumem series Prometheus stored.
    query = f'{{job="gpumem", __name__=~"gpumem_.*|hw_gpu_.*"}}[{window}]'
    series = api(prom, "query", query=query, time=now)["result"]
    problems = check_labels(series, host)
    if problems:
        fail("labels:\n  " + "\n  ".join(problems))
    problems, compared = check_values(series, records_by_rank)
    if problems:
        fail("values:\n  " + "\n  ".join(problems[:20]))
    steps_seen = {
        r: sorted({int(v) for s in series if s["metric"]["__name__"] == "gpumem_cell" and s["metric"]["rank"] == str(r)
                   for _, v in s["values"]})
        for r in RANKS
    }
    if any(len(v) < 3 for v in steps_seen.values()):
        fail(f"too few steps scraped: {steps_seen}")
    if compared < 100:
        fail(f"only {compared} values compared")

    # The checks can fail: altered copies of what Prometheus stored are caught.
    def altered(change):
        copy = json.loads(json.dumps(series))
        change(copy)
        return copy

    no_rank = altered(lambda ss: ss[0]["metric"].pop("rank"))
    with_pid = altered(lambda ss: ss[-1]["metric"].update(pid="4242"))
    one_rank = altered(lambda ss: [s["metric"].update(rank="0") for s in ss])
    def bump(ss):
        reserved = next(s for s in ss if s["metric"]["__name__"] == "gpumem_reserved_bytes")
        reserved["values"][-1][1] = str(int(reserved["values"][-1][1]) + 1)

    off_by_one = altered(bump)
    for what, s in [("a rank label gone", no_rank), ("a pid kept", with_pid), ("one rank only", one_rank)]:
        if not check_labels(s, host):
            fail(f"the label check missed {what}")
    if not check_values(off_by_one, records_by_rank)[0]:
        fail("the value check missed a value off by one")

    # The dashboard's queries, when both ranks were up (both had served their last step).
    last = min(max(t for t, _ in s["values"]) for s in series if s["metric"]["__name__"] == "gpumem_cell")
    for title, q in dashboard_queries():
        result = api(prom, "query", query=q, time=f"{last:.3f}")["result"]
        ranks = sorted({r["metric"].get("rank") for r in result}, key=str)
        if ranks != [str(r) for r in RANKS]:
            fail(f"dashboard panel {title!r}: {q}\n  returned ranks {ranks} ({len(result)} series)")
    print(
        f"OK ({how}, Slurm job {JOB_ID}): 2 ranks ({STEPS} steps each, steps {steps_seen[0][0]}..{steps_seen[0][-1]} and "
        f"{steps_seen[1][0]}..{steps_seen[1][-1]} scraped), {len(series)} series with exactly the bounded labels, "
        f"{compared} stored values equal the ranks' records, {len(dashboard_queries())} dashboard queries return "
        f"both ranks; altered copies caught"
    )


if __name__ == "__main__":
    main()
