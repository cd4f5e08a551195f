#!/usr/bin/env bash
# A single-node Slurm cluster on localhost, for the time of one command: installs Debian's
# Slurm and MUNGE when missing, starts munged, slurmctld and slurmd as root with their own
# configuration, key, sockets, ports and state in a private folder (never /etc/slurm,
# /etc/munge or the system's daemons), waits for the node to be idle, runs the command,
# and stops the daemons it started, whatever happens.
#
# Usage: tools/slurm-local.sh [-n N] COMMAND [ARG...]
#   -n N   run COMMAND under `srun -n N` (the node has this machine's real CPU count:
#          more tasks than CPUs need srun's --overcommit, else the job stays pending)
#   else   run COMMAND as is, with SLURM_CONF exported: it may call srun (and sinfo,
#          squeue...) itself, as often as it likes, on the same running cluster
# Exits with the command's status. Environment: DOS_SLURM_DIR (the private folder,
# default /tmp/starpu-dos-slurm; emptied at each run), DOS_SLURM_PORT (slurmctld's port,
# default 16817; slurmd takes the next one: not Slurm's 6817/6818, so that a system
# Slurm on this host is left alone). Needs root (the daemons run as root, and apt).
set -euo pipefail

die() {
	printf 'slurm-local: error: %s\n' "$*" >&2
	exit 1
}
log() { printf 'slurm-local: %s\n' "$*" >&2; }

ntasks=
if [[ ${1:-} == -n ]]; then
	ntasks=${2:?-n needs a task count}
	[[ $ntasks =~ ^[1-9][0-9]*$ ]] || die "-n takes a positive task count, got '$ntasks'"
	shift 2
fi
[[ $# -gt 0 ]] || die "usage: $0 [-n N] COMMAND [ARG...]"
[[ $(id -u) == 0 ]] || die "run as root: slurmd must run as root to start tasks (and apt installs Slurm)"

dir=${DOS_SLURM_DIR:-/tmp/starpu-dos-slurm}
ctld_port=${DOS_SLURM_PORT:-16817}
slurmd_port=$((ctld_port + 1))

# ---- packages: Debian's Slurm 22.05 and MUNGE (6 packages, about 3 MB) ----------------
# Not in tools/deps.sh: on a systemd host, installing them enables system daemons, which
# nobody who only builds starpu-dos should get. --no-install-recommends: the recommended
# plugins (HDF5, RRD, ROCm, MySQL...) add 30 packages that a local srun does not use.
packages=(slurmctld slurmd slurm-client munge)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
	log "apt-get install ${missing[*]}"
	# the package lists may be older than the archive's current versions
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
		{ apt-get update -qq >&2 &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; } ||
		die "could not install ${missing[*]}"
fi

# ---- stop what an earlier run left behind (killed before its trap ran) ------------------
# Only processes whose pid files are in our own folder, and only if they still run the
# program that wrote the file: a recycled pid is left alone.
stop_daemons() {
	local name pid
	for name in slurmd slurmctld munged; do
		[[ -f $dir/$name.pid ]] || continue
		pid=$(cat "$dir/$name.pid")
		if [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]]; then
			kill "$pid" 2>/dev/null || true
			for _ in $(seq 50); do # up to 5 s, then no mercy
				[[ -d /proc/$pid ]] || break
				sleep 0.1
			done
			kill -9 "$pid" 2>/dev/null || true
		fi
		rm -f "$dir/$name.pid"
	done
}
# The folder is emptied at each run: only one this script made (it holds the marker).
[[ ! -e $dir || -f $dir/.starpu-dos-slurm ]] ||
	die "DOS_SLURM_DIR=$dir exists and was not made by $0: name a new folder"
stop_daemons
trap 'stop_daemons' EXIT
rm -rf "$dir"
# 0700: munged refuses a socket or key that others could reach
mkdir -m 0700 "$dir" "$dir"/{state,spool,munge}
touch "$dir/.starpu-dos-slurm"

# ---- MUNGE: its own key and socket ----------------------------------------------------
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 0400 "$dir/munge/munge.key"
socket=$dir/munge/munge.socket
# --force: munged refuses to run as root otherwise (here root owns everything it checks)
munged --force --socket="$socket" --key-file="$dir/munge/munge.key" --pid-file="$dir/munged.pid" \
	--log-file="$dir/munged.log" --seed-file="$dir/munge/munged.seed" ||
	die "munged did not start: $(tail -n 5 "$dir/munged.log" 2>/dev/null)"

# ---- slurm.conf ---------------------------------------------------------------------------
# The node exactly as slurmd sees it (CPUs, sockets, cores, threads, memory): a node
# declared larger than it is would be drained at registration.
node=$(slurmd -C | head -n 1 | sed 's/^NodeName=[^ ]*/NodeName=localhost/')
[[ $node == NodeName=localhost\ CPUs=* ]] || die "unexpected 'slurmd -C' output: $node"
cat >"$dir/slurm.conf" <<EOF
ClusterName=starpu-dos-local
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
# no cgroups in containers: processes are tracked by their parent chain, tasks not bound
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Open MPI 4.1 from Debian speaks PMIx (its pmix/ext3x component, on the same libpmix2
# as Slurm's mpi_pmix plugin); it has no PMI-2 client
MpiDefault=pmix
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
# a node that came back after a crashed run is usable at once
ReturnToService=2
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$dir/slurm.conf

# ---- the daemons --------------------------------------------------------------------------
# -c: start without the state of an earlier cluster; both daemons fork and write pid files
slurmctld -c || die "slurmctld did not start: $(tail -n 5 "$dir/slurmctld.log" 2>/dev/null)"
slurmd -N localhost || die "slurmd did not start: $(tail -n 5 "$dir/slurmd.log" 2>/dev/null)"

state=
for _ in $(seq 300); do # up to 30 s
	state=$(sinfo -h -N -n localhost -o '%T' 2>/dev/null || true)
	[[ $state == idle ]] && break
	sleep 0.1
done
if [[ $state != idle ]]; then
	log "node state '${state:-unknown}' after 30 s; the logs:"
	tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
	die "the local Slurm node did not become idle"
fi
log "Slurm up in $dir ($(sinfo -h -o '%P %D node(s) %c CPUs %T'))"

# The command runs in the background so that a signal to this script is handled at once
# (bash defers traps until a foreground command ends): the command is stopped, then the
# EXIT trap stops the daemons. Its standard input stays ours (not /dev/null).
[[ -n $ntasks ]] && set -- srun -n "$ntasks" "$@"
"$@" <&0 &
command_pid=$!
trap 'kill "$command_pid" 2>/dev/null; exit 130' INT
trap 'kill "$command_pid" 2>/dev/null; exit 143' TERM HUP
status=0
wait "$command_pid" || status=$?
exit $status
