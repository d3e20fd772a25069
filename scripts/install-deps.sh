#!/bin/sh
# Installs the Debian packages dtrain needs, only those that are missing.
# Usage: scripts/install-deps.sh [extra packages...]
set -e
need="build-essential cmake pkg-config iproute2 nftables libcjson-dev libmicrohttpd-dev libcurl4-openssl-dev curl python3 zlib1g-dev libopenmpi-dev openmpi-bin libopenblas-openmp-dev libdnnl-dev clang libomp-dev libjs-chart.js libnetfilter-queue-dev iptables libprotobuf-c-dev protobuf-c-compiler libpcre2-dev libunistring-dev liblapacke-dev libbox2d-dev $*"
missing=""
for p in $need; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "dtrain: missing packages:$missing (run as root, or install them with apt-get)" >&2
    exit 1
fi
echo "dtrain: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing >/dev/null
