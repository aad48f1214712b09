#!/usr/bin/env bash
# A throwaway Slurm on this machine, for test.sh: munged, slurmctld and slurmd (as root), their
# configuration and state in DIR, one node named `localhost` (127.0.0.1) with this machine's
# CPUs and two GPUs that are not there (gres on /dev/null and /dev/zero: Slurm hands them out,
# nothing uses them; the ranks run on the simulated device). Installs Debian's slurm-wlm and
# munge when missing.
#   local_slurm.sh start DIR     prints the SLURM_CONF to use once the node takes jobs
#   local_slurm.sh stop DIR      ends the daemons it started (by their pid files)
set -euo pipefail
cmd="${1:?start or stop}"
dir="$(mkdir -p "${2:?DIR}" && cd "$2" && pwd)"

# munged runs as the munge user, which cannot reach a DIR under a home of mode 700 (/root, where
# CI's target lies): its key, socket and log live in a directory of their own under /tmp,
# named in DIR/munge_dir.
stop() {
    local munge="" pid name
    [ -s "$dir/munge_dir" ] && munge="$(cat "$dir/munge_dir")"
    # Only a directory this script made (the file could name anything).
    case "$munge" in /tmp/gpumem-slurm-munge.*) ;; *) munge="" ;; esac
    for file in "$dir/slurmd.pid" "$dir/slurmctld.pid" ${munge:+"$munge/munged.pid"}; do
        [ -s "$file" ] || continue
        pid="$(cat "$file")"
        # A pid file left by an earlier run may name a pid reused since: only our daemons.
        name="$(ps -o comm= -p "$pid" 2>/dev/null || true)"
        case "$name" in slurmd | slurmctld | munged) kill "$pid" 2>/dev/null || true ;; esac
    done
    if [ -n "$munge" ]; then
        sleep 0.2
        rm -rf "$munge"
    fi
    rm -f "$dir/munge_dir"
}
if [ "$cmd" = stop ]; then
    stop
    exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing Debian's slurm-wlm and munge" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
    else
        echo "FAIL: no Slurm (install Debian's slurm-wlm and munge, as root)" >&2
        exit 1
    fi
fi
stop
rm -rf "$dir"/{state,spool,log} && mkdir -p "$dir"/{state,spool,log}
munge="$(mktemp -d /tmp/gpumem-slurm-munge.XXXXXX)"
echo "$munge" > "$dir/munge_dir"
chown munge: "$munge" && chmod 755 "$munge"
# A key of its own, so that nothing else on the machine can speak to this Slurm.
dd if=/dev/urandom of="$munge/munge.key" bs=1024 count=1 status=none
chown munge: "$munge/munge.key" && chmod 400 "$munge/munge.key"
runuser -u munge -- /usr/sbin/munged --key-file="$munge/munge.key" --socket="$munge/munge.socket" \
    --pid-file="$munge/munged.pid" --log-file="$munge/munged.log" --seed-file="$munge/munged.seed"

# Two free ports for slurmctld and slurmd.
read -r ctld_port slurmd_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
cat > "$dir/slurm.conf" <<CONF
ClusterName=gpumem-test
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) Gres=gpu:2 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
echo "NodeName=localhost Name=gpu File=/dev/null" > "$dir/gres.conf"
echo "NodeName=localhost Name=gpu File=/dev/zero" >> "$dir/gres.conf"
export SLURM_CONF="$dir/slurm.conf"
slurmctld -i
slurmd -N localhost
for _ in $(seq 60); do
    if sinfo -h -n localhost -o %t 2>/dev/null | grep -qx idle; then
        echo "$SLURM_CONF"
        exit 0
    fi
    sleep 0.5
done
echo "FAIL: the node never took jobs: $(sinfo -h -N -o '%N %t %E' 2>&1)" >&2
tail -5 "$dir"/log/*.log >&2
stop
exit 1
