#!/usr/bin/env python3
"""Runs test binaries that cargo built, in lanes side by side (scripts/test.sh, the kernel's tests).

    scripts/test_lanes.py MESSAGES --lane ENV NAME... [--lane ENV NAME...] [-- TEST-ARGS...]

MESSAGES: the output of `cargo test --no-run --message-format=json-render-diagnostics`. Each
--lane names its test targets (a name as cargo prints it under "Running", `*` for every target
no other lane names) and one environment assignment for its binaries (`VAR=value`, or "" for
none). A lane runs its binaries one after another, as `cargo test` would: from the package's
directory, with TEST-ARGS, stopping at the first that fails; the lanes run at once. Each
binary's output is printed whole when it ends, under the line cargo would print before it.
Exit status: 0 when every binary of every lane ran and passed, 1 otherwise (the failing ones
named; a lane that died of an exception is named with it, and its binaries left unrun count as
not passed).
"""

import json
import os
import subprocess
import sys
import threading
import time
import traceback


def parse(argv):
    if "--" in argv:
        i = argv.index("--")
        argv, test_args = argv[:i], argv[i + 1:]
    else:
        test_args = []
    if not argv or argv[0].startswith("--"):
        sys.exit("usage: test_lanes.py MESSAGES --lane ENV NAME... [--lane ENV NAME...] [-- TEST-ARGS...]")
    messages, lanes, rest = argv[0], [], argv[1:]
    while rest:
        if rest[0] != "--lane" or len(rest) < 3:
            sys.exit(f"test_lanes.py: expected `--lane ENV NAME...`, found {rest[0]!r}")
        env, rest = rest[1], rest[2:]
        if env and "=" not in env:
            sys.exit(f"test_lanes.py: a lane's environment must be VAR=value or \"\", not {env!r}")
        names = []
        while rest and rest[0] != "--lane":
            names.append(rest.pop(0))
        if not names:
            sys.exit("test_lanes.py: a lane names no test target")
        lanes.append((env, names))
    return messages, lanes, test_args


def binaries(messages):
    """(name, source, executable, package directory) of each test binary, in cargo's order."""
    found = []
    with open(messages) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            m = json.loads(line)
            if m.get("reason") != "compiler-artifact" or not m.get("profile", {}).get("test") or not m.get("executable"):
                continue
            t = m["target"]
            pkg_dir = os.path.dirname(m["manifest_path"])
            source = os.path.relpath(t["src_path"], pkg_dir)
            found.append((t["name"], source, m["executable"], pkg_dir))
    # Cargo's own order: the libraries' and binaries' unit tests, then the tests by name.
    return sorted(found, key=lambda b: (b[1].startswith("tests/"), b[3], b[1]))


def main():
    messages, lanes, test_args = parse(sys.argv[1:])
    bins = binaries(messages)
    if not bins:
        sys.exit(f"test_lanes.py: {messages} lists no test binary (did the build fail?)")
    named = {n for _, names in lanes for n in names if n != "*"}
    unknown = named - {b[0] for b in bins}
    if unknown:
        sys.exit(f"test_lanes.py: no test binary named {', '.join(sorted(unknown))}")
    plan = []
    for env, names in lanes:
        chosen = [b for b in bins if b[0] in names]
        if "*" in names:
            chosen += [b for b in bins if b[0] not in named and b not in chosen]
        plan.append((env, chosen))
    out_lock = threading.Lock()
    failed = []
    passed = [0]  # binaries that ran and passed, all lanes
    start = time.monotonic()

    def run_lane(k, env, chosen):
        # An exception ends a thread with a traceback on stderr and nothing else: the lane is
        # failed here, by name, or the run would say its binaries passed.
        try:
            lane(k, env, chosen)
        except BaseException as e:
            with out_lock:
                traceback.print_exc(file=sys.stdout)
                print(f"error: lane {k} died: {type(e).__name__}: {e}", flush=True)
                failed.append(f"lane {k} died ({type(e).__name__}: {e})")

    def lane(k, env, chosen):
        environ = dict(os.environ)
        if env:
            var, value = env.split("=", 1)
            environ[var] = value
        for name, source, exe, pkg_dir in chosen:
            t0 = time.monotonic()
            p = subprocess.run([exe, *test_args], cwd=pkg_dir, env=environ, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace")
            took = time.monotonic() - t0
            with out_lock:
                print(f"     Running {source} ({exe}) [lane {k}, {took:.0f} s]", flush=True)
                sys.stdout.write(p.stdout)
                if p.returncode != 0:
                    print(f"error: test failed, to rerun pass `--test {name}` (lane {k}, exit {p.returncode})", flush=True)
                    failed.append(f"{name} (lane {k})")
                else:
                    passed[0] += 1
                sys.stdout.flush()
            if p.returncode != 0:
                return

    for k, (env, chosen) in enumerate(plan, 1):
        print(f"lane {k}{' with ' + env if env else ''}: {', '.join(b[0] for b in chosen) or 'nothing'}", flush=True)
    threads = [threading.Thread(target=run_lane, args=(k, env, chosen)) for k, (env, chosen) in enumerate(plan, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - start
    planned = sum(len(c) for _, c in plan)
    if failed:
        print(f"FAIL after {took:.0f} s: {', '.join(failed)} ({passed[0]} of {planned} test binaries passed)")
        return 1
    if passed[0] != planned:
        # Every way out of a lane is above; this only says so if one is ever missed.
        print(f"FAIL after {took:.0f} s: {passed[0]} of {planned} test binaries ran and passed")
        return 1
    print(f"{planned} test binaries passed in {len(plan)} lanes in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
