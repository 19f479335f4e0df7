#!/usr/bin/env bash
# A stand-in for ssh that Open MPI starts its daemons with (`--mca plm_rsh_agent
# netns_rsh.sh`), whose "hosts" are network namespaces of this machine:
# `netns_rsh.sh HOST COMMAND...` runs COMMAND (one shell string, as ssh would) inside the
# namespace that the map file $TRIPOD_NETNS_MAP names for HOST (lines "HOST NAMESPACE"),
# in a UTS namespace of its own whose host name is HOST. The environment passes through,
# as it does on a cluster with a shared file system.
set -u
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done # ssh-style options: none apply
if [ $# -lt 2 ]; then
  echo "netns_rsh: usage: netns_rsh.sh HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
map=${TRIPOD_NETNS_MAP:-}
ns=$([ -r "$map" ] && awk -v h="$host" '$1 == h { print $2; exit }' "$map")
if [ -z "$ns" ]; then
  echo "netns_rsh: host '$host' is not in the map file '$map' (\$TRIPOD_NETNS_MAP)" >&2
  exit 255
fi
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$1" && exec sh -c "$2"' netns_rsh "$host" "$*"
