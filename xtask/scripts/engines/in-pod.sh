#!/bin/sh
# in-pod.sh CGROUP_DIR COMMAND...: run COMMAND as a kubelet runs a container's process: in the
# cgroup CGROUP_DIR (made if missing; name it as kubelet would, e.g.
# .../kubepods.slice/kubepods-pod<uid>.slice/cri-containerd-<64 hex>.scope) and in its own PID
# and mount namespaces (with its own /proc, as a container has), where it is PID 1. When this
# process (then `unshare`) dies, COMMAND is killed, and with it everything in its namespace.
set -eu
dir=$1
shift
mkdir -p "$dir"
echo $$ >"$dir/cgroup.procs"
exec unshare --pid --mount --mount-proc --fork --kill-child -- "$@"
