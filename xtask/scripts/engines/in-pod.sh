#!/bin/sh
# in-pod.sh CGROUP_DIR COMMAND...: run COMMAND as a kubelet runs a container's process: in the
# cgroup CGROUP_DIR (made if missing; name it as kubelet would, e.g.
# .../kubepods.slice/kubepods-pod<uid>.slice/cri-containerd-<64 hex>.scope) and in its own PID
# and mount namespaces, where it is PID 1. When this process (then `unshare`) dies, COMMAND is
# killed, and with it everything in its PID namespace.
set -eu
dir=$1
shift
mkdir -p "$dir"
echo $$ >"$dir/cgroup.procs"
exec unshare --pid --mount --fork --kill-child -- "$@"
