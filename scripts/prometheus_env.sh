# Sourced by the tests that run a real Prometheus (kernel/tests/prometheus.sh,
# deploy/slurm/test.sh): `need_prometheus` installs Debian's prometheus when it is missing, or
# says what to install and fails.
need_prometheus() {
    command -v prometheus >/dev/null && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing Debian's prometheus"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    else
        echo "FAIL: no prometheus (install Debian's prometheus package)"
        exit 1
    fi
}
