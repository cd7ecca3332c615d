#!/usr/bin/env bash
# A one-host Slurm for the launcher tests (tests/slurm/): installs slurm-wlm + munge from the distribution's
# packages when missing, writes a slurm.conf for this host only (no cgroup, no accounting database), starts
# munged, slurmctld and slurmd as plain daemons (no systemd) and waits until `sinfo` shows the node idle.
# Idempotent: a second call finds the daemons up and returns at once. Needs root (apt, daemons as root).
# Usable by hand too:  sudo bash tests/slurm/setup_slurm.sh   (MOE_OVERLAP_SLURM_NO_INSTALL=1: start only, the
# tests' own call when not in CI, so that a test run never installs system packages unasked)
# Exit 0: Slurm is up. Exit 3: it could not be set up; the last line on stderr says why (the tests skip with it).
set -uo pipefail

fail() { echo "setup_slurm: $*" >&2; exit 3; }

CONF_DIR=/etc/slurm
STATE=${MOE_OVERLAP_SLURM_STATE:-/var/spool/moe-overlap-slurm}
HOST=$(hostname -s 2>/dev/null || cut -d. -f1 /proc/sys/kernel/hostname)

# A process of this name is running (from /proc: minimal images have no procps/pgrep).
running() {  # (a zombie, exited but not reaped, does not count)
  local d; for d in /proc/[0-9]*; do
    [ "$(cat "$d/comm" 2>/dev/null)" = "$1" ] && ! grep -qE '^[0-9]+ \(.*\) Z ' "$d/stat" 2>/dev/null && return 0
  done; return 1
}
node_idle() { sinfo -h -N -n "$HOST" -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; }

if command -v sinfo >/dev/null && running slurmctld >/dev/null && running slurmd >/dev/null && node_idle; then
  echo "setup_slurm: Slurm already up on $HOST"; exit 0
fi
[ "$(id -u)" = 0 ] || fail "needs root to install packages and start the daemons (run it with sudo)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  [ "${MOE_OVERLAP_SLURM_NO_INSTALL:-0}" = 1 ] && fail "slurm-wlm/munge are not installed (to install them and start a one-host Slurm: sudo bash tests/slurm/setup_slurm.sh)"
  command -v apt-get >/dev/null || fail "slurm-wlm is not installed and there is no apt-get to install it"
  echo "setup_slurm: installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -q && apt-get install -y -q --no-install-recommends slurm-wlm munge; } >/tmp/setup_slurm_apt.log 2>&1 \
    || fail "apt-get install slurm-wlm munge failed: $(tail -n 2 /tmp/setup_slurm_apt.log | tr '\n' ' ')"
fi

# munge: one key for this host, daemon as root (--force: the Debian package's key dir ownership differs per image).
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
[ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
chmod 400 /etc/munge/munge.key
if ! running munged >/dev/null; then
  munged --force >/tmp/setup_slurm_munged.log 2>&1 || fail "munged did not start: $(tail -n 2 /tmp/setup_slurm_munged.log)"
fi
for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
munge -n </dev/null | unmunge >/dev/null 2>&1 || fail "munge does not answer (munged running? /run/munge writable?)"

CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d" /var/log/slurm
# Addresses are 127.0.0.1: a container whose hostname does not resolve still works.
# No cgroup anywhere: CI containers have no writable cgroup tree. linuxproc tracks a job's processes by their
# parent pids, which is what scancel needs to end every rank.
cat >"$CONF_DIR/slurm.conf" <<CONF
# written by moe-overlap tests/slurm/setup_slurm.sh: one host, for the launcher tests
ClusterName=moe-overlap-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$HOST NodeAddr=127.0.0.1 NodeHostname=$HOST CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
: >"$CONF_DIR/cgroup.conf"

running slurmctld >/dev/null || slurmctld -c >/tmp/setup_slurm_ctld.log 2>&1 \
  || fail "slurmctld did not start: $(tail -n 2 /var/log/slurm/slurmctld.log 2>/dev/null | tr '\n' ' ')"
running slurmd >/dev/null || slurmd >/tmp/setup_slurm_d.log 2>&1 \
  || fail "slurmd did not start: $(tail -n 2 /var/log/slurm/slurmd.log 2>/dev/null | tr '\n' ' ')"
for _ in $(seq 60); do
  node_idle && { echo "setup_slurm: Slurm up on $HOST ($CPUS CPUs)"; exit 0; }
  scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
  sleep 1
done
fail "the node $HOST is not idle after 60 s: $(sinfo -h -N -o '%N %t %E' 2>&1 | head -n 1); see /var/log/slurm/"
