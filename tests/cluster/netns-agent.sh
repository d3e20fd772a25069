#!/bin/sh
# Open MPI's launch agent for the rig (plm_rsh_agent), in place of ssh: runs
# the daemon's command line in the "machine" named HOST, a network namespace
# of that name, under its own host name (a UTS namespace).
# usage (by mpirun): netns-agent.sh [ssh-style options] HOST COMMAND...
while [ $# -gt 0 ]; do
    case $1 in
        -x|-T|-q) shift ;;          # options Open MPI may give ssh
        -*) shift ;;
        *) break ;;
    esac
done
host=$1
shift
exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
