#!/usr/bin/env bash
# `make test-node`: the suite as users deploy it, on a real kubelet.
#   1. builds the image here, offline: the release binaries and what they need at run time
#      (the Dockerfile's runtime stage) as an image tarball, imported into the node;
#   2. installs the chart with the reference driver; the registrar registers with the kubelet;
#   3. smoke: claim -> provisioned -> attached -> staged/published by the kubelet -> a real
#      container writes and reads -> deleted -> PV and volume gone, no mount left; then a pod's
#      CSI ephemeral inline volume: made by the driver, written and read, gone with the pod;
#   4. fencing against a real writer: a protected pod keeps appending numbered records; the
#      node's kubelet is stopped (its containers keep running); podmon fences and cleans up;
#      no record lands after the fence; the kubelet comes back and the node is untainted;
#   5. COSI (with ../shared/k8s's node): moto on the host's pod bridge is the object store; the
#      chart's cosi-controller and cosi-s3 + cosi-provisioner run as containers; a BucketClaim
#      and a BucketAccess get a bucket and a Secret whose key reads and writes it, until the
#      access is deleted (the key is refused) and the claim too (the bucket is gone);
#   6. uninstalls the chart; nothing is left behind (but the COSI CRDs and classes it keeps).
# The node and control plane are ../shared/k8s's (started and stopped here, once for each of
# K8S_VERSIONS, default "1.28 1.19") unless KUBECONFIG names a cluster that already has the
# image; step 4 needs ../shared/k8s's node.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${KUBECONFIG:-}" ] && [ -z "${K8S_VERSION:-}" ]; then
  for version in ${K8S_VERSIONS:-1.28 1.19}; do
    begin=$SECONDS
    echo "test-node: on a v$version node"
    K8S_VERSION=$version "$0" "$@"
    echo "test-node: v$version passed in $((SECONDS - begin)) s"
  done
  exit 0
fi

K8S=${K8S_DIR:-../shared/k8s}
CARGO=${CARGO:-cargo}
NAMESPACE=csi-suite
RELEASE=csi-suite
DRIVER=hostpath.csi-suite.io
NODE=${NODE_NAME:-node-1}
NODE_DIR=${NODE_DIR:-/tmp/csi-suite-node}
STATE_DIR=/var/lib/csi-hostpath-data
# The node's address on the pod bridge of ../shared/k8s (where pods reach the host).
POD_BRIDGE=10.244.0.1
MOTO_SERVER=${MOTO_SERVER:-$PWD/.tools/moto/bin/moto_server}
VERSION=$(sed -n 's/^appVersion: *"\(.*\)"/\1/p' charts/csi-suite/Chart.yaml)
IMAGE=csi-suite:$VERSION
WORK=target/test-node
TIMEOUT=${STEP_TIMEOUT:-180}
HEARTBEAT_NODE="heartbeat-1"

scripts/install-tools.sh helm kubectl
helm=$PWD/.tools/bin/helm
kubectl=$PWD/.tools/bin/kubectl
mkdir -p "$WORK"

managed=""
installed=""
heartbeat=""
moto=""
cleanup() {
  status=$?
  if [ -n "$moto" ]; then kill "$moto" 2>/dev/null || true; fi
  if [ -n "$heartbeat" ]; then
    kill "$heartbeat" 2>/dev/null || true
    "$kubectl" delete node "$HEARTBEAT_NODE" --wait=false >/dev/null 2>&1 || true
  fi
  if [ $status -ne 0 ] && [ -n "$installed" ]; then
    echo "== test-node failed: state of the cluster" >&2
    "$kubectl" get pods -A -o wide >&2 || true
    "$kubectl" -n "$NAMESPACE" logs -l app.kubernetes.io/component=node --all-containers --tail=40 >&2 || true
    "$kubectl" -n "$NAMESPACE" logs -l app.kubernetes.io/component=controller --all-containers --tail=40 >&2 || true
    "$kubectl" -n "$NAMESPACE" logs -l 'app.kubernetes.io/component in (cosi-controller,cosi-driver)' --all-containers --tail=40 >&2 || true
    "$kubectl" -n "$NAMESPACE" logs -l app.kubernetes.io/component=cosi-driver --all-containers --previous --tail=40 >&2 || true
    "$kubectl" -n "$NAMESPACE" describe pods -l app.kubernetes.io/component=cosi-driver 2>&1 | tail -40 >&2 || true
  fi
  if [ -n "$installed" ]; then "$helm" uninstall "$RELEASE" -n "$NAMESPACE" --wait >/dev/null 2>&1 || true; fi
  if [ -n "$managed" ]; then
    "$K8S/node" down || true
    "$K8S/control-plane" down || true
    umount -l "$STATE_DIR" 2>/dev/null || true
  fi
  exit $status
}
trap cleanup EXIT

fail() { echo "test-node: $*" >&2; exit 1; }
# until SECONDS WHAT COMMAND...: runs COMMAND until it succeeds, for at most SECONDS.
until_ok() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "timed out waiting for $what"
    sleep 1
  done
  echo "   ok: $what"
}
# has GREP-OPTIONS PATTERN COMMAND...: COMMAND succeeds and grep finds PATTERN in its output;
# lacks ...: COMMAND succeeds and grep does not. The output is read whole before grep sees it:
# under pipefail, `COMMAND | grep -q` fails, or `! COMMAND | grep -q` passes, whenever grep stops
# reading at its match before COMMAND's last write and COMMAND dies of SIGPIPE.
has() {
  local options=$1 pattern=$2 out; shift 2
  out=$("$@") || return 1
  grep "$options" -- "$pattern" <<<"$out" >/dev/null
}
lacks() {
  local options=$1 pattern=$2 out; shift 2
  out=$("$@") || return 1
  ! grep "$options" -- "$pattern" <<<"$out" >/dev/null
}
# again COMMAND...: ../shared/k8s's `up` scripts check for the pod bridge's address with exactly
# such a pipeline, so when the address is already there (always, for `node up`) they try to add
# it again about one time in ten and fail before doing anything else. Each step they take is
# idempotent, so try again.
again() {
  local attempt
  for attempt in 1 2 3 4 5; do
    "$@" && return 0
    echo "test-node: $* failed (attempt $attempt), trying again" >&2
    sleep 1
  done
  return 1
}

# s3 ACTION...: the object store as a workload and its administrator see it (boto3, from moto's
# own environment): `set-up` makes the administrator (printed as "ID SECRET");
# `put-get INFO` writes and reads an object with a credentials Secret's BucketInfo JSON;
# `refused INFO` succeeds when the store refuses those credentials; `bucket-gone NAME` when the
# administrator no longer finds the bucket.
s3() {
  "$(dirname "$MOTO_SERVER")/python" - "$S3_ENDPOINT" "$@" <<'PY'
import json, sys
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
endpoint, action, arg = sys.argv[1], sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else "")
def client(service, key_id, secret):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=key_id, aws_secret_access_key=secret,
                        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
if action == "set-up":
    iam = client("iam", "set-up", "set-up")
    iam.create_user(UserName="cosi-admin")
    iam.put_user_policy(UserName="cosi-admin", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="cosi-admin")["AccessKey"]
    print(key["AccessKeyId"], key["SecretAccessKey"])
elif action in ("put-get", "refused"):
    info = json.loads(arg)["spec"]
    keys = info["secretS3"]
    assert keys["endpoint"] == endpoint, keys["endpoint"]
    s3 = client("s3", keys["accessKeyID"], keys["accessSecretKey"])
    try:
        s3.put_object(Bucket=info["bucketName"], Key="proof", Body=b"written-by-a-workload")
        body = s3.get_object(Bucket=info["bucketName"], Key="proof")["Body"].read()
    except ClientError as error:
        print(error, file=sys.stderr)
        sys.exit(0 if action == "refused" else 1)
    sys.exit(0 if action == "put-get" and body == b"written-by-a-workload" else 1)
elif action == "bucket-gone":
    key_id, secret = open(sys.argv[4]).read().split()
    try:
        client("s3", key_id, secret).head_bucket(Bucket=arg)
    except ClientError as error:
        sys.exit(0 if error.response["Error"]["Code"] in ("404", "NoSuchBucket") else 1)
    sys.exit(1)
PY
}

if [ -z "${KUBECONFIG:-}" ]; then
  [ -x "$K8S/node" ] || fail "set KUBECONFIG to a cluster, or put the node tools at $K8S"
  managed=1
  # Pods reach the API server through the kubernetes Service only on the pod network.
  cp_env=$(CP_POD_NETWORK=1 again "$K8S/control-plane" up) || fail "the control plane did not come up"
  eval "$(grep '^export KUBECONFIG=' <<<"$cp_env")"
  again "$K8S/node" up || fail "the node did not come up"
  # The reference driver's volumes of an earlier run on this test node.
  umount -l "$STATE_DIR" 2>/dev/null || true
  rm -rf "$STATE_DIR"
  # The controller's exports of ext4 volumes reach the node pod by mount propagation, which
  # needs the state directory on a shared mount: systemd hosts share /, this machine does not.
  mkdir -p "$STATE_DIR"
  mount --bind "$STATE_DIR" "$STATE_DIR"
  mount --make-shared "$STATE_DIR"
fi
export KUBECONFIG

echo "== image $IMAGE from the release binaries"
# The release binaries come from `make build` (make test-node does that first).
for binary in kube-sim csi-hostpath csi-provisioner; do
  [ -x "target/release/$binary" ] || fail "no target/release/$binary: run 'make build'"
done
$CARGO run --locked -q -p csi-suite-scenarios --example node_image -- \
  target/release "$IMAGE" "$WORK/csi-suite.tar"
if [ -n "$managed" ]; then "$K8S/node" import "$WORK/csi-suite.tar" >/dev/null; fi

# A namespace accepts pods once its default ServiceAccount (and, before v1.24, its token) exists.
server_minor=$("$kubectl" get --raw /version |
  python3 -c 'import json, sys; print(int(json.load(sys.stdin)["minor"].rstrip("+")))')
if [ "$server_minor" -lt 24 ]; then token_path='{.secrets[0].name}'; else token_path='{.metadata.name}'; fi
namespace() {
  "$kubectl" create namespace "$1" >/dev/null
  until_ok 60 "namespace $1 admits pods" \
    sh -c "'$kubectl' -n '$1' get serviceaccount default -o jsonpath='$token_path' | grep -q ."
}

echo "== install the chart"
namespace "$NAMESPACE"
cosi_values=()
if [ -n "$managed" ]; then
  # The object store for COSI: moto (S3 and IAM, IAM enforced after the three set-up calls) on
  # the host's pod bridge, where the node's pods reach it.
  moto_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
  S3_ENDPOINT="http://$POD_BRIDGE:$moto_port"
  INITIAL_NO_AUTH_ACTION_COUNT=3 "$MOTO_SERVER" -H "$POD_BRIDGE" -p "$moto_port" > "$WORK/moto.log" 2>&1 &
  moto=$!
  # A connection, not a request: moto counts requests against the three set-up calls.
  until_ok 60 "moto listening on $S3_ENDPOINT" bash -c "exec 3<>/dev/tcp/$POD_BRIDGE/$moto_port"
  admin=$(s3 set-up)
  "$kubectl" -n "$NAMESPACE" create secret generic s3-admin \
    --from-literal=AWS_ACCESS_KEY_ID="${admin% *}" --from-literal=AWS_SECRET_ACCESS_KEY="${admin#* }" >/dev/null
  cosi_values=(--set cosi.installCRDs=true --set cosi.controller.enabled=true --set cosi.driver.enabled=true
    --set cosi.s3.endpoint="$S3_ENDPOINT" --set cosi.s3.credentialsSecret=s3-admin
    --set cosi.bucketClass.create=true --set cosi.bucketAccessClass.create=true)
fi
installed=1
"$helm" install "$RELEASE" charts/csi-suite --namespace "$NAMESPACE" \
  --set storageClass.create=true --set driver.controller.node="$NODE" \
  --set podmon.skipArrayConnectionValidation=true --set podmon.maxEvacuatedFraction=1 --set podmon.arrayConnectivityPollRate=2 \
  --set inventory.serve.enabled=true --set 'csiDriver.volumeLifecycleModes={Persistent,Ephemeral}' \
  "${cosi_values[@]}" \
  --wait --timeout "${TIMEOUT}s"
until_ok "$TIMEOUT" "the kubelet registered $DRIVER (CSINode $NODE)" \
  has -w "$DRIVER" "$kubectl" get csinode "$NODE" -o jsonpath='{.spec.drivers[*].name}'
has -F "$DRIVER" "$kubectl" get node "$NODE" -o jsonpath='{.metadata.annotations.csi\.volume\.kubernetes\.io/nodeid}' ||
  fail "no node-ID annotation for $DRIVER on $NODE"

echo "== inventory: the serving container scans the driver with the chart's RBAC"
# Its first scan runs at start, on an empty driver: clean, no failed scan (a missing grant would
# fail it with 403), a scan time set. Pod IPs are on the host's pod bridge.
controller_ip=$("$kubectl" -n "$NAMESPACE" get pod -l app.kubernetes.io/component=controller \
  -o jsonpath='{.items[0].status.podIP}')
inventory_metrics() { curl -sf "http://$controller_ip:9811/metrics"; }
until_ok 120 "csi-inventory served a scan" has -E '^csi_inventory_last_scan_timestamp_seconds [1-9]' inventory_metrics
has -x 'csi_inventory_findings{kind="orphaned"} 0' inventory_metrics || fail "csi-inventory found orphans on an empty driver"
has -x 'csi_inventory_scan_errors_total 0' inventory_metrics || fail "a csi-inventory scan failed (see its log)"

if [ -n "$managed" ]; then
  echo "== COSI: a bucket and its credentials, through the chart's containers and RBAC"
  namespace objects
  "$kubectl" -n objects apply -f - >/dev/null <<YAML
apiVersion: objectstorage.k8s.io/v1alpha1
kind: BucketClaim
metadata: {name: data}
spec: {bucketClassName: csi-suite-buckets, protocols: [S3]}
---
apiVersion: objectstorage.k8s.io/v1alpha1
kind: BucketAccess
metadata: {name: data}
spec: {bucketClaimName: data, bucketAccessClassName: csi-suite-keys, credentialsSecretName: data-creds, protocol: S3}
YAML
  until_ok "$TIMEOUT" "the BucketClaim ready" \
    has -x true "$kubectl" -n objects get bucketclaim data -o jsonpath='{.status.bucketReady}'
  until_ok "$TIMEOUT" "the credentials Secret written" "$kubectl" -n objects get secret data-creds
  info=$("$kubectl" -n objects get secret data-creds -o jsonpath='{.data.BucketInfo}' | base64 -d)
  bucket=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["spec"]["bucketName"])' "$info")
  s3 put-get "$info" || fail "the Secret's credentials did not write and read bucket $bucket"
  echo "   ok: the Secret's key wrote and read bucket $bucket"
  "$kubectl" -n objects delete bucketaccess data --wait --timeout "${TIMEOUT}s" >/dev/null
  until_ok "$TIMEOUT" "the credentials Secret deleted" sh -c "! '$kubectl' -n objects get secret data-creds"
  s3 refused "$info" 2>/dev/null || fail "the revoked key still reaches bucket $bucket"
  echo "   ok: the revoked key is refused"
  "$kubectl" -n objects delete bucketclaim data --wait --timeout "${TIMEOUT}s" >/dev/null
  echo "$admin" > "$WORK/s3-admin"
  until_ok "$TIMEOUT" "bucket $bucket deleted at the store" s3 bucket-gone "$bucket" "$WORK/s3-admin"
  [ -z "$("$kubectl" get buckets -o name)" ] || fail "a Bucket object is left"
  "$kubectl" delete namespace objects --wait --timeout "${TIMEOUT}s" >/dev/null
else
  echo "skipped COSI: its object store runs on the pod bridge of $K8S/node"
fi

echo "== smoke: provision, attach, stage, publish, write, read, delete"
namespace smoke
sed "s|image: busybox:1.36|image: ${BUSYBOX:-registry.local/busybox:1}|" e2e/smoke.yaml |
  "$kubectl" -n smoke apply -f - >/dev/null
"$kubectl" -n smoke wait pod/smoke --for=condition=Ready --timeout "${TIMEOUT}s" >/dev/null
has -x written-by-smoke "$kubectl" -n smoke exec smoke -- cat /data/proof ||
  fail "the smoke pod did not read back what it wrote"
echo "   ok: a real container wrote and read its volume"
pv=$("$kubectl" -n smoke get pvc smoke -o jsonpath='{.spec.volumeName}')
has -x "$pv true" "$kubectl" get volumeattachments \
  -o jsonpath='{range .items[*]}{.spec.source.persistentVolumeName} {.status.attached}{"\n"}{end}' ||
  fail "no attached VolumeAttachment for $pv"
"$kubectl" delete namespace smoke --wait --timeout "${TIMEOUT}s" >/dev/null
until_ok "$TIMEOUT" "PV $pv deleted" sh -c "! '$kubectl' get pv '$pv'"
lacks -F "/$pv/" findmnt -rn -o TARGET || fail "a mount of $pv is left on the host"
[ -z "$(ls "$STATE_DIR/exports/$NODE" 2>/dev/null)" ] || fail "an export is left in $STATE_DIR/exports/$NODE"
echo "   ok: PV, volume, export and mounts gone"

# record ID: the driver's record of volume ID, as JSON; fails when there is none. The state
# file: a header line, the state as of its last compaction, then one line per committed change
# (the rows it changed; null: removed). A last line without its newline is a write under way,
# not committed.
record() {
  python3 - "$STATE_DIR/state.log" "$1" <<'PY'
import json, sys
lines = open(sys.argv[1], "rb").read().split(b"\n")
state = json.loads(lines[1])
for line in lines[2:-1]:
    for volume_id, volume in json.loads(line).get("volumes", {}).items():
        if volume is None:
            state["volumes"].pop(volume_id, None)
        else:
            state["volumes"][volume_id] = volume
volume = state["volumes"].get(sys.argv[2])
if volume is None:
    sys.exit(1)
print(json.dumps(volume))
PY
}
not_recorded() { ! record "$1" >/dev/null; }

echo "== inline: a CSI ephemeral inline volume, made for its pod and gone with it"
namespace inline
"$kubectl" -n inline apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: inline}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: inline
      image: ${BUSYBOX:-registry.local/busybox:1}
      command: [sh, -c, 'echo written-inline > /scratch/proof && exec sleep 3600']
      volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes:
    - name: scratch
      csi: {driver: $DRIVER, volumeAttributes: {color: blue}}
YAML
"$kubectl" -n inline wait pod/inline --for=condition=Ready --timeout "${TIMEOUT}s" >/dev/null
has -x written-inline "$kubectl" -n inline exec inline -- cat /scratch/proof ||
  fail "the inline pod did not read back what it wrote"
# The kubelet's handle of an inline volume: csi-<sha256 of the pod's UID and the volume's name>.
uid=$("$kubectl" -n inline get pod inline -o jsonpath='{.metadata.uid}')
inline=csi-$(printf '%s%s' "$uid" scratch | sha256sum | cut -d' ' -f1)
has -x written-inline cat "$STATE_DIR/volumes/$inline/proof" ||
  fail "the inline pod's file is not in the driver's volume $inline"
has -F '"color": "blue"' record "$inline" || fail "no record of the inline volume $inline"
has -F "/pods/$uid/volumes/kubernetes.io~csi/scratch/mount" findmnt -rn -o TARGET ||
  fail "the inline volume is not mounted in the pod's directory"
echo "   ok: a real container wrote and read its inline volume $inline"
"$kubectl" delete namespace inline --wait --timeout "${TIMEOUT}s" >/dev/null
until_ok "$TIMEOUT" "inline volume $inline deleted with its pod" not_recorded "$inline"
[ ! -e "$STATE_DIR/volumes/$inline" ] || fail "the data of the inline volume $inline is left"
lacks -F "/pods/$uid/" findmnt -rn -o TARGET || fail "a mount of the inline pod is left on the host"
echo "   ok: the inline volume's record, data and mount gone"

if [ -z "$managed" ]; then
  echo "skipped fencing against a real writer: it stops the kubelet of $K8S/node"
  exit 0
fi

echo "== fencing: stop the kubelet under a writing container"
# kube-controller-manager taints a silent node unreachable:NoExecute (what podmon acts on) only
# while other nodes of its zone are healthy: with every node down it assumes it is the one cut
# off and taints nothing. A second node — kube-sim's kubelet role, heartbeats only, tainted so
# nothing runs there — keeps the zone partly healthy, as in any cluster of more than one node.
target/release/kube-sim roles --kubeconfig "$KUBECONFIG" --roles kubelet \
  --nodes "$HEARTBEAT_NODE" --root "$PWD/$WORK/heartbeat" > "$WORK/heartbeat.log" 2>&1 &
heartbeat=$!
until_ok 60 "node $HEARTBEAT_NODE Ready" \
  has -x True "$kubectl" get node "$HEARTBEAT_NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}'
"$kubectl" taint node "$HEARTBEAT_NODE" csi-suite.io/heartbeat-only=:NoSchedule >/dev/null
namespace fence
"$kubectl" -n fence apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: csi-suite
  resources: {requests: {storage: 16Mi}}
---
apiVersion: v1
kind: Pod
metadata:
  name: writer
  labels: {podmon.dellemc.com/driver: $DRIVER}
spec:
  terminationGracePeriodSeconds: 5
  containers:
    - name: writer
      image: ${BUSYBOX:-registry.local/busybox:1}
      # A record per write, each write its own open of the file: the fence must stop the
      # container, not only close an open file.
      command: [sh, -c, 'i=0; while :; do i=\$((i+1)); echo \$i >> /data/records; sleep 0.05; done']
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
YAML
"$kubectl" -n fence wait pod/writer --for=condition=Ready --timeout "${TIMEOUT}s" >/dev/null
pv=$("$kubectl" -n fence get pvc data -o jsonpath='{.spec.volumeName}')
handle=$("$kubectl" get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
# The volume is ext4 (the chart's StorageClass): while the node's export is up, the records
# show through it on the host.
records="$STATE_DIR/exports/$NODE/$handle/volume/records"
count() { [ -f "$records" ] && wc -l < "$records" || echo 0; }
until_ok 60 "the writer writing" sh -c "[ \$(wc -l < '$records') -gt 20 ]"
# image_records: the records the image itself holds, read through a loop device of our own
# once the export is cut (ext4 replays its journal, as after a crash).
image_records() {
  local dev
  mkdir -p "$WORK/image"
  dev=$(losetup --find --show "$STATE_DIR/volumes/$handle.img")
  mount -o ro "$dev" "$WORK/image"
  cat "$WORK/image/volume/records" > "$1"
  umount "$WORK/image"
  losetup -d "$dev"
}
# complete_records FILE: how many records FILE holds, each a line "1", "2", ... in order. The
# write in flight when the I/O was cut may leave a tail without its newline, NUL bytes where its
# data did not reach the image (its size did): that torn record is not counted. Any other tail,
# or a line out of order, fails.
complete_records() {
  python3 - "$1" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
body, newline, tail = data.rpartition(b"\n")
lines = body.split(b"\n") if newline else []
for number, line in enumerate(lines, 1):
    if line != str(number).encode():
        sys.exit(f"{sys.argv[1]}: record {number} reads {line[:32]!r}: the records are not contiguous")
if not str(len(lines) + 1).encode().startswith(tail.rstrip(b"\0")):
    sys.exit(f"{sys.argv[1]}: the last record is neither whole nor a torn write: {tail[:32]!r}")
print(len(lines))
PY
}

kill "$(cat "$NODE_DIR/kubelet.pid")"
stopped_at=$(count)
until_ok 30 "the container writing on without its kubelet" sh -c "[ \$(wc -l < '$records') -gt $((stopped_at + 20)) ]"
fenced() {
  local volume
  volume=$(record "$handle") || return 1
  python3 -c 'import json, sys; sys.exit(0 if sys.argv[2] in json.loads(sys.argv[1]).get("fenced", {}) else 1)' \
    "$volume" "$NODE"
}
until_ok "$TIMEOUT" "the driver fenced $NODE from the volume" fenced
[ ! -e "$STATE_DIR/exports/$NODE/$handle" ] || fail "the export of $handle to $NODE is still there"
image_records "$WORK/records-at-fence"
at_fence=$(complete_records "$WORK/records-at-fence") || fail "the image at the fence is torn"
running_tasks() { "$K8S/node" ctr tasks ls | awk 'NR>1 && $3=="RUNNING" {print $1}'; }
container=$("$K8S/node" ctr containers ls -q \
  'labels."io.kubernetes.pod.namespace"==fence,labels."io.kubernetes.container.name"==writer' | sed -n 1p)
[ -n "$container" ] || fail "the writer's container is not on the node"
until_ok 30 "the writer's container stopped" lacks -x "$container" running_tasks
until_ok "$TIMEOUT" "podmon force-deleted the pod" sh -c "! '$kubectl' -n fence get pod writer"
has -F podmon.storage/fenced "$kubectl" get node "$NODE" -o jsonpath='{.spec.taints[*].key}' ||
  fail "$NODE does not carry podmon's fenced taint"
image_records "$WORK/records"
final=$(complete_records "$WORK/records") || fail "the image after the fence is torn"
torn=$(( $(wc -c < "$WORK/records") - $(head -n "$final" "$WORK/records" | wc -c) ))
echo "   records: $stopped_at when the kubelet stopped, $at_fence at the fence, $final now ($torn byte(s) of a torn last write)"
[ "$final" -eq "$at_fence" ] || fail "$((final - at_fence)) record(s) landed after the fence"
cmp -s "$WORK/records-at-fence" "$WORK/records" || fail "the image changed after the fence"
echo "   ok: zero writes after the fence"

echo "== the kubelet comes back; node-podmon cleans up and lifts the taint"
again "$K8S/node" up >/dev/null || fail "the node did not come back"
until_ok "$TIMEOUT" "$NODE untainted" \
  lacks -F podmon.storage/fenced "$kubectl" get node "$NODE" -o jsonpath='{.spec.taints[*].key}'
"$kubectl" delete namespace fence --wait --timeout "${TIMEOUT}s" >/dev/null
until_ok "$TIMEOUT" "PV $pv deleted" sh -c "! '$kubectl' get pv '$pv'"

echo "== uninstall: nothing left behind"
"$helm" uninstall "$RELEASE" -n "$NAMESPACE" --wait --timeout "${TIMEOUT}s" >/dev/null
installed=""
until_ok "$TIMEOUT" "the suite's pods gone" sh -c "[ -z \"\$('$kubectl' -n '$NAMESPACE' get pods -o name)\" ]"
until_ok "$TIMEOUT" "$DRIVER unregistered" \
  lacks -w "$DRIVER" "$kubectl" get csinode "$NODE" -o jsonpath='{.spec.drivers[*].name}'
if findmnt -rn -o TARGET | grep -E "^/var/lib/kubelet/(pods/.*/volumes/kubernetes.io~csi|plugins/kubernetes.io/csi)/"; then
  fail "CSI mounts are left on the host"
fi
[ -z "$(ls "$STATE_DIR/volumes" 2>/dev/null)" ] || fail "volumes are left in $STATE_DIR"
# The COSI CRDs and classes stay by design (deleting a CRD deletes every object of its kind).
has -x csi-suite-buckets "$kubectl" get bucketclasses -o jsonpath='{.items[*].metadata.name}' ||
  fail "the BucketClass did not outlive the release"
"$kubectl" delete bucketclasses,bucketaccessclasses --all >/dev/null
"$kubectl" get crd -o name | grep objectstorage.k8s.io | xargs "$kubectl" delete >/dev/null
echo "test-node: passed"
