#!/usr/bin/env bash
# A throwaway single-node Slurm for tests: munged, MariaDB + slurmdbd (so that sacct
# works), slurmctld and slurmd, started by hand as root, without systemd or cgroups,
# listening on 127.0.0.1 (see bind_params). The node has one fake GPU (gres/gpu with File=/dev/null),
# so a job asking for --gpus=1 gets CUDA_VISIBLE_DEVICES=0. Everything lives under ROOT.
#
#   tests/slurm/cluster.sh start ROOT    # prints the node when it is idle
#   . ROOT/env.sh                        # SLURM_CONF, and ROOT/bin (srun wrapper) on PATH
#   tests/slurm/cluster.sh stop ROOT     # cancels jobs, stops every daemon by its PID file
#
# Needs root and Debian's packages: slurmctld slurmd slurm-client slurmdbd munge
# mariadb-server. Ports (override through the environment): CTLD_PORT=16817,
# SLURMD_PORT=16818, DBD_PORT=16819, DB_PORT=13306. The cluster, partition and
# account are all called "ci". Logs are under ROOT/log. ROOT must be short (unix socket
# paths) and every directory above it enterable by others (munged checks), e.g. /tmp/slurm.
set -euo pipefail

usage() { echo "usage: $0 start|stop ROOT" >&2; exit 2; }
[ $# -eq 2 ] || usage
ACTION=$1
ROOT=$(realpath -m "$2")

CTLD_PORT=${CTLD_PORT:-16817}
SLURMD_PORT=${SLURMD_PORT:-16818}
DBD_PORT=${DBD_PORT:-16819}
DB_PORT=${DB_PORT:-13306}
HOST=$(hostname -s)
MSOCK=$ROOT/munge/munge.socket.2
DBSOCK=$ROOT/mysql/mysqld.sock
export SLURM_CONF=$ROOT/etc/slurm.conf

# Retry "$@" (quietly, 5 s per try) until it succeeds; give up after LIMIT seconds.
wait_for() {
  local what=$1 limit=$2; shift 2   # WHAT LIMIT COMMAND...
  local deadline=$((SECONDS + limit))
  until timeout -s KILL 5 "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "cluster.sh: gave up after ${limit}s waiting for $what" >&2
      return 1
    fi
    sleep 0.2
  done
}

# slurmctld binds to SlurmctldHost's address (127.0.0.1) with NoCtldInAddrAny. slurmd,
# slurmdbd and srun bind, with NoInAddrAny, to the address the host name resolves to:
# that is 127.0.0.1 only where /etc/hosts says so (as on a laptop or this sandbox); in a
# container whose name resolves to its network address they keep listening on all
# interfaces (binding there would break NodeAddr=127.0.0.1).
bind_params() {
  COMM_PARAMS=NoCtldInAddrAny
  DBD_COMM_PARAMS=""
  if getent ahostsv4 "$(hostname)" | awk 'NR == 1 { exit !($1 ~ /^127\./) }'; then
    COMM_PARAMS=NoInAddrAny,NoCtldInAddrAny
    DBD_COMM_PARAMS=CommunicationParameters=NoInAddrAny
  else
    echo "cluster.sh: $(hostname) does not resolve to 127.x; slurmd and slurmdbd listen on all interfaces" >&2
  fi
}

write_configs() {
  bind_params
  # Node topology and memory as slurmd itself sees them (no socket/core mismatch).
  local topo mem
  topo=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ RealMemory=.*//')
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  mem=$((mem * 9 / 10))

  cat >"$ROOT/etc/slurm.conf" <<EOF
ClusterName=ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MSOCK
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool/slurmd-%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd.log
# no cgroups, no systemd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
# listen on 127.0.0.1, not on all interfaces (see bind_params)
CommunicationParameters=$COMM_PARAMS
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# without it a job with no --mem would take the whole node
DefMemPerCPU=1000
GresTypes=gpu
# accounting through slurmdbd, so that sacct works (the plugin's status command)
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# the munge socket for the slurmctld/sacct -> slurmdbd connection (AuthInfo is not used there)
AccountingStoragePass=$MSOCK
# AllocTRES then shows gres/gpu=N
AccountingStorageTRES=gres/gpu
# sacct -o Comment shows the plugin's "rule_<name>_wildcards_..." comment
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
Waittime=0
NodeName=$HOST NodeAddr=127.0.0.1 $topo RealMemory=$mem Gres=gpu:1 State=UNKNOWN
PartitionName=ci Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF

  # slurmd 22.05 drops a GPU without File= ("Removing file-less GPU"); /dev/null is a
  # fake device, and the job still gets CUDA_VISIBLE_DEVICES=0.
  cat >"$ROOT/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=$HOST Name=gpu File=/dev/null
EOF

  cat >"$ROOT/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MSOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
$DBD_COMM_PARAMS
SlurmUser=root
LogFile=$ROOT/log/slurmdbd.log
PidFile=$ROOT/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmci
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$ROOT/etc/slurmdbd.conf"

  # The slurm-jobstep plugin removes SLURM_CONF (with every SLURM_* variable) before
  # its `srun` inside the job; this wrapper, first on PATH, puts it back.
  cat >"$ROOT/bin/srun" <<EOF
#!/bin/sh
export SLURM_CONF=$SLURM_CONF
exec /usr/bin/srun "\$@"
EOF
  chmod 755 "$ROOT/bin/srun"

  cat >"$ROOT/env.sh" <<EOF
export SLURM_CONF=$SLURM_CONF
export PATH=$ROOT/bin:\$PATH
EOF
}

start() {
  [ "$(id -u)" = 0 ] || { echo "cluster.sh: must run as root" >&2; exit 1; }
  if [ -e "$ROOT/run/slurmctld.pid" ]; then
    echo "cluster.sh: $ROOT already holds a cluster; stop it first" >&2; exit 1
  fi
  mkdir -p "$ROOT"/{etc,state,spool/slurmd-"$HOST",log,run,munge,mysql,bin}
  chmod 755 "$ROOT" "$ROOT/munge"   # munged: the socket dir must be o+x
  write_configs

  # munge
  mungekey -c -k "$ROOT/munge/munge.key" >/dev/null
  munged -S "$MSOCK" --key-file="$ROOT/munge/munge.key" --log-file="$ROOT/munge/munged.log" \
    --pid-file="$ROOT/run/munged.pid" --seed-file="$ROOT/munge/munged.seed" \
    </dev/null >>"$ROOT/log/daemons.out" 2>&1
  wait_for munged 20 sh -c "munge -S '$MSOCK' -n | unmunge -S '$MSOCK'"

  # MariaDB (TCP on 127.0.0.1 only) for slurmdbd
  mariadb-install-db --no-defaults --datadir="$ROOT/mysql/data" --user=root \
    --auth-root-authentication-method=normal --skip-test-db >"$ROOT/log/mariadb-install.log" 2>&1
  setsid mariadbd --no-defaults --datadir="$ROOT/mysql/data" --user=root --bind-address=127.0.0.1 \
    --port="$DB_PORT" --socket="$DBSOCK" --pid-file="$ROOT/mysql/mysqld.pid" \
    --log-error="$ROOT/log/mariadb.log" --innodb-buffer-pool-size=64M --skip-name-resolve \
    </dev/null >>"$ROOT/log/daemons.out" 2>&1 &
  echo $! >"$ROOT/run/mariadbd.pid"
  wait_for mariadbd 60 mariadb-admin --no-defaults -S "$DBSOCK" -uroot ping
  mariadb --no-defaults -S "$DBSOCK" -uroot -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmci';
    CREATE DATABASE slurm_acct_db; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"

  # slurmdbd (reads slurmdbd.conf beside $SLURM_CONF), then the cluster, account and user
  slurmdbd </dev/null >>"$ROOT/log/daemons.out" 2>&1
  wait_for slurmdbd 30 sacctmgr -n list cluster
  timeout -s KILL 20 sacctmgr -i add cluster ci >/dev/null
  timeout -s KILL 20 sacctmgr -i add account ci Description=ci Organization=ci >/dev/null
  timeout -s KILL 20 sacctmgr -i add user root Account=ci DefaultAccount=ci >/dev/null

  # controller and node
  slurmctld -f "$SLURM_CONF" </dev/null >>"$ROOT/log/daemons.out" 2>&1
  slurmd -f "$SLURM_CONF" </dev/null >>"$ROOT/log/daemons.out" 2>&1
  wait_for "node $HOST to be idle" 30 sh -c '[ "$(sinfo -h -N -o %T)" = idle ]'
  sinfo -N -o "%N %P %T %c %m %G"
}

# Stop the daemon whose PID is in $1, if it is still the program named $2.
stop_pidfile() {
  local pidfile=$1 name=$2 pid i
  [ -s "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "$name" ]; then
    rm -f "$pidfile"; return 0           # already gone (or the PID was reused)
  fi
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do             # 10 s, then SIGKILL
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  echo "stopped $name ($pid)"
  rm -f "$pidfile"
}

stop() {
  local dir pid i
  if [ -e "$ROOT/run/slurmctld.pid" ]; then
    # cancel what is left (e.g. after snakemake was killed), give the steps a moment
    timeout -s KILL 10 scancel --full --user=root >/dev/null 2>&1 || true
    for i in $(seq 1 50); do
      [ -z "$(timeout -s KILL 5 squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  stop_pidfile "$ROOT/run/slurmd.pid" slurmd
  # job-step daemons of this cluster (they inherit SLURM_CONF from slurmd)
  for dir in /proc/[0-9]*; do
    [ "$(cat "$dir/comm" 2>/dev/null)" = slurmstepd ] || continue
    if tr '\0' '\n' <"$dir/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF"; then
      pid=${dir#/proc/}
      kill -KILL "$pid" 2>/dev/null && echo "stopped slurmstepd ($pid)"
    fi
  done
  stop_pidfile "$ROOT/run/slurmctld.pid" slurmctld
  stop_pidfile "$ROOT/run/slurmdbd.pid" slurmdbd
  stop_pidfile "$ROOT/run/mariadbd.pid" mariadbd
  stop_pidfile "$ROOT/run/munged.pid" munged
}

case $ACTION in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
