#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for the Slurm tests and for trying the submitit
# launcher locally:  .ci/slurm.sh start | stop | status | env
#
#   .ci/slurm.sh start               # munged, slurmctld, slurmd; waits until the node is idle
#   eval "$(.ci/slurm.sh env)"       # SLURM_CONF for sbatch/squeue/sinfo in this shell
#   python repro/run.py -m sweep=smoke hydra/launcher=submitit_slurm hydra.launcher.partition=debug
#   .ci/slurm.sh stop                # stops only the daemons this script started (pid files)
#
# Needs root and Debian's slurm-wlm + munge (apt-get install slurm-wlm munge). Everything lives
# in $DTFM_SLURM_DIR (default: <tmp>/dtfm-slurm): slurm.conf, state, spool, logs, pid files.
# The ports are not Slurm's defaults, so a real cluster's daemons on this host do not collide.
# Exit codes: 0 ok, 3 Slurm cannot start here (the reason on stderr; tests skip with it).
set -euo pipefail

DIR="${DTFM_SLURM_DIR:-${TMPDIR:-/tmp}/dtfm-slurm}"
CTLD_PORT="${DTFM_SLURMCTLD_PORT:-16817}"
SLURMD_PORT="${DTFM_SLURMD_PORT:-16818}"
PARTITION=debug
HOST="$(hostname -s)"

cannot() { echo "slurm.sh: cannot start Slurm here: $*" >&2; exit 3; }

write_conf() {
  local cpus mem_mib
  cpus="$(nproc)"
  # RealMemory: physical memory less 2 GiB for the system (at least 512 MiB)
  mem_mib=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 2048 ))
  [ "$mem_mib" -ge 512 ] || mem_mib=512
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
  cat > "$DIR/slurm.conf.tmp" <<EOF
# written by .ci/slurm.sh: one node, one partition, no cgroups (Slurm 22.05 knows no
# CgroupPlugin=disabled; without a cgroup.conf slurmd starts)
ClusterName=dtfm
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=60
KillWait=5
NodeName=$HOST CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  mv "$DIR/slurm.conf.tmp" "$DIR/slurm.conf"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pid() {  # stop_pid NAME PIDFILE: TERM, wait up to 10 s, then KILL
  local pidfile="$2" pid i
  alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid="$(cat "$pidfile")"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "slurm.sh: $1 ($pid) ignored SIGTERM; killing it" >&2
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

start() {
  [ "$(id -u)" = 0 ] || cannot "needs root (munged and slurmd run as root)"
  for t in munged slurmctld slurmd sinfo sbatch; do
    command -v "$t" >/dev/null || cannot "$t is not on PATH (apt-get install slurm-wlm munge; the daemons live in /usr/sbin)"
  done
  write_conf
  export SLURM_CONF="$DIR/slurm.conf"
  # munge: a key once per machine (1024 random bytes, mode 400, owner munge); our own daemon
  if [ ! -s /etc/munge/munge.key ]; then
    install -d -m 700 -o munge -g munge /etc/munge
    head -c 1024 /dev/urandom > /etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  install -d -m 755 -o munge -g munge /run/munge
  if ! alive "$DIR/munged.pid"; then
    if pgrep -x munged >/dev/null; then
      echo "slurm.sh: a munged not started by this script is running; using it" >&2
    else
      munged --force --pid-file "$DIR/munged.pid" || cannot "munged did not start"
    fi
  fi
  alive "$DIR/slurmctld.pid" || slurmctld -f "$SLURM_CONF" || cannot "slurmctld did not start (see $DIR/log)"
  alive "$DIR/slurmd.pid" || slurmd -f "$SLURM_CONF" || cannot "slurmd did not start (see $DIR/log)"
  local i state=""
  for i in $(seq 1 60); do  # bounded: 30 s
    state="$(sinfo -h -N -o %t 2>/dev/null | head -1 || true)"
    case "$state" in idle|mix|alloc) echo "slurm: node $HOST $state, SLURM_CONF=$SLURM_CONF"; return 0 ;; esac
    sleep 0.5
  done
  stop
  cannot "node did not become idle within 30 s (last state '${state:-none}', logs in $DIR/log)"
}

stop() {
  # jobs first (their steps would outlive slurmd otherwise), then the daemons we started
  if alive "$DIR/slurmctld.pid"; then
    SLURM_CONF="$DIR/slurm.conf" scancel --partition "$PARTITION" 2>/dev/null || true
  fi
  stop_pid slurmd "$DIR/slurmd.pid"
  stop_pid slurmctld "$DIR/slurmctld.pid"
  stop_pid munged "$DIR/munged.pid"
  echo "slurm: stopped (state kept in $DIR)"
}

status() {
  local n
  for n in munged slurmctld slurmd; do
    if alive "$DIR/$n.pid"; then echo "$n running ($(cat "$DIR/$n.pid"))"; else echo "$n stopped"; fi
  done
  if alive "$DIR/slurmctld.pid"; then SLURM_CONF="$DIR/slurm.conf" sinfo; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$DIR/slurm.conf" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
