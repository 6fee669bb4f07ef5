#!/usr/bin/env bash
# Open MPI's launch agent for the two-namespace "cluster" of multihost_test.sh, in place of ssh:
# `netns_agent.sh [ssh options] HOST COMMAND...` runs COMMAND in the namespace that owns HOST's
# address. The map is the file MOD_NETNS_HOSTS names ("ADDRESS NAMESPACE" per line), so the
# agent can only reach namespaces the test made; an unknown host fails, never runs locally.
set -u
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do  # ssh-style options mpirun may pass (-x, -o ...)
  case $1 in -o|-p|-l|-i) shift 2 ;; *) shift ;; esac
done
host=${1:?usage: netns_agent.sh HOST COMMAND...}
shift
ns=$(awk -v h="$host" '$1 == h { print $2 }' "${MOD_NETNS_HOSTS:?MOD_NETNS_HOSTS is not set}")
if [ -z "$ns" ]; then
  echo "netns_agent: no namespace for host '$host' in $MOD_NETNS_HOSTS" >&2
  exit 255
fi
# mpirun hands ssh one command string for a remote shell; run it in one here too.
exec ip netns exec "$ns" /bin/sh -c "$*"
