"""A real Prometheus for the tests that check what it scraped (kernel/tests/prometheus_check.py,
deploy/slurm/check.py): started on a configuration, waited for until ready, stopped after.

    with prometheus_server.running(config_path, out, "127.0.0.1:PORT", fail):
        ...  # query http://127.0.0.1:PORT/api/v1/…
"""
import contextlib
import os
import subprocess
import time
import urllib.request


@contextlib.contextmanager
def running(config_path, out, listen, fail):
    """Prometheus on `config_path`, its data and log (`prometheus.log`) under `out`, serving on
    `listen`; `fail(message)` when it is not ready within about 20 s. Stopped on leaving."""
    log = open(os.path.join(out, "prometheus.log"), "w")
    server = subprocess.Popen(
        ["prometheus", f"--config.file={config_path}", f"--storage.tsdb.path={out}/data",
         f"--web.listen-address={listen}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://{listen}/-/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        else:
            fail("Prometheus did not become ready (see prometheus.log)")
        yield server
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
