#!/bin/bash
# launch_binds_loopback.sh BUILD_DIR SOURCE_DIR — `ration launch` on one node opens no listening socket
# beyond loopback: while 2 ranks train, every TCP socket in LISTEN state owned by the launcher's children (if
# any) is bound to 127.0.0.1 (the rendezvous goes through a file in a private directory, Gloo binds loopback). Before,
# rank 0's TCPStore listened on *:MASTER_PORT, reachable and unauthenticated from the network.
set -u
build=$1 src=$2
log=$(mktemp)
trap 'rm -f "$log"; [ -n "${launcher:-}" ] && kill "$launcher" 2>/dev/null' EXIT
fail() { echo "---- launcher output ----"; cat "$log"; echo "FAIL: $*"; exit 1; }
"$build/ration" launch -n 2 --master-port 0 -- train "$src/configs/mlp.toml" --steps 100000 --set train.threads=1 \
  --set train.checkpoint_dir= --set train.log_every=1 >"$log" 2>&1 &
launcher=$!
for _ in $(seq 1 600); do grep -q "step 3/" "$log" && break; sleep 0.1; done
grep -q "step 3/" "$log" || fail "training did not start"
pids=$(pgrep -P "$launcher" | tr '\n' ' ')
[ -n "$pids" ] || fail "no ranks under the launcher"
python3 - $pids <<'PY' || fail "a rank listens beyond loopback"
import os, sys
inodes = {}
for pid in sys.argv[1:]:
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes[target[8:-1]] = pid
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).readlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:  # LISTEN
            listening.append((inodes[f[9]], f[1]))
def loopback(addr):
    ip = addr.split(":")[0]
    return ip == "0100007F" or ip == "00000000000000000000000001000000"
print("listening sockets of the ranks (pid, address:port hex):", listening)
bad = [l for l in listening if not loopback(l[1])]
assert not bad, f"listening beyond loopback: {bad}"
PY
echo PASS
