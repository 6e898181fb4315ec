#!/usr/bin/env bash
# The Swarm deployment tested across three real Docker engines on this machine
# (docs/cluster.md, "Docker Swarm"): each engine in its own container (Docker-in-Docker,
# without --privileged) on a private network, a swarm formed, the images loaded (no
# registry), deploy/swarm/stack.yaml deployed. Then it proves:
#   1. sessions spread over the nodes and keep their state;
#   2. `docker kill` of a node's engine -> its sessions report node_lost from the survivors,
#      and no kernel of the old epoch runs when it returns;
#   3. `docker network disconnect` of a node -> it fences itself (its kernels gone before its
#      lease could expire) and rejoins after reconnect; while Swarm briefly runs two agents
#      on it, never both serve;
#   4. one rolling upgrade of the agent without drain and one with (--drain-deadline),
#      counting the sessions that lost state.
# It prints the timings. Everything it creates is named kbswarm-* and removed at the end.
# It never touches the host engine's own swarm (the swarm is formed by the inner engines).
#
# usage: deploy/swarm/test.sh   (from the repository root; builds the images it needs
#        offline from kernelbox/base:bookworm; KERNELBOX_BINARY=target/debug/kernelbox)
set -euo pipefail
cd "$(dirname "$0")/../.."

binary=${KERNELBOX_BINARY:-target/debug/kernelbox}
net=kbswarm-net
prefix=10.213.0
agent=kernelbox/agent:kbswarm
token=kbswarm-tenant-$RANDOM$RANDOM
admin=kbswarm-admin-$RANDOM$RANDOM
pgpass=kbswarm-pg-$RANDOM$RANDOM
api="http://$prefix.11:8081"
started=$(date +%s)

say() { printf '[%5ss] %s\n' "$(( $(date +%s) - started ))" "$*"; }
now() { date +%s.%N; }
since() { python3 -c "print(f'{$(now) - $1:.1f}')"; }
node_ip() { echo "$prefix.1$1"; }
ndocker() { local n=$1; shift; docker -H "tcp://$(node_ip "$n"):2375" "$@"; }

cleanup() {
  set +e
  for n in 1 2 3; do docker rm -f "kbswarm-node$n" >/dev/null 2>&1; done
  for n in 1 2 3; do docker volume rm "kbswarm-node$n" >/dev/null 2>&1; done
  docker network rm "$net" >/dev/null 2>&1
  docker rmi "$agent" kernelbox/agent:kbswarm-v2 kernelbox/agent:kbswarm-v3 >/dev/null 2>&1
  rm -rf "${work:-/nonexistent}"
}
trap cleanup EXIT
cleanup
work=$(mktemp -d /tmp/kbswarm-XXXXXX)

# --- images, built offline ---------------------------------------------------------------
say "building the images (offline, from kernelbox/base:bookworm)"
for x in node postgres haproxy; do
  docker image inspect "kbswarm/$x:latest" >/dev/null 2>&1 ||
    docker build -q -f "deploy/swarm/$x.Dockerfile" -t "kbswarm/$x:latest" deploy/swarm >/dev/null
done
docker build -q -f deploy/swarm/agent.Dockerfile --build-arg "BINARY=$binary" -t "$agent" . >/dev/null
docker image inspect kernelbox/kernel:latest >/dev/null

# --- three engines ------------------------------------------------------------------------
say "starting three engines (kbswarm-node1..3 on $net)"
docker network create --subnet "$prefix.0/24" "$net" >/dev/null
for n in 1 2 3; do
  docker run -d --name "kbswarm-node$n" --hostname "kbswarm-node$n" \
    --cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined \
    --security-opt systempaths=unconfined --device /dev/fuse \
    --network "$net" --ip "$(node_ip "$n")" -e "KBSWARM_BIP=10.214.$n.1/24" \
    -v "kbswarm-node$n:/var/lib/docker" kbswarm/node:latest >/dev/null
done
wait_engine() {
  for _ in $(seq 1 120); do ndocker "$1" info >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "engine $1 did not come up"; docker logs --tail 20 "kbswarm-node$1"; return 1
}
for n in 1 2 3; do wait_engine "$n"; done
say "loading the images into each engine"
docker save "$agent" kernelbox/kernel:latest > "$work/common.tar"
docker save kbswarm/postgres:latest kbswarm/haproxy:latest > "$work/manager.tar"
for n in 1 2 3; do ndocker "$n" load -q -i "$work/common.tar" >/dev/null & done
ndocker 1 load -q -i "$work/manager.tar" >/dev/null &
wait
rm -f "$work"/*.tar

# --- the swarm and the stack --------------------------------------------------------------
say "forming the swarm (node1 manager, node2 and node3 workers)"
ndocker 1 swarm init --advertise-addr "$(node_ip 1)" >/dev/null
join=$(ndocker 1 swarm join-token -q worker)
for n in 2 3; do ndocker "$n" swarm join --token "$join" "$(node_ip 1):2377" >/dev/null; done
printf '%s' "$pgpass" | ndocker 1 secret create kb_pg_password - >/dev/null
printf 'postgres://kernelbox:%s@postgres:5432/kernelbox' "$pgpass" | ndocker 1 secret create kb_db_url - >/dev/null
printf '%s' "$admin" | ndocker 1 secret create kb_admin_token - >/dev/null
{
  cat deploy/swarm/kernelbox.toml
  python3 -c 'import hashlib,sys; print("\n[[tenants]]\nname = \"acme\"\ntoken_sha256 = \"%s\"" % hashlib.sha256(sys.argv[1].encode()).hexdigest())' "$token"
} | ndocker 1 config create kb_config - >/dev/null
ndocker 1 config create kb_haproxy deploy/swarm/haproxy.cfg >/dev/null
# No warm pool here: every kernel then carries its session's labels, which the checks below
# count through each engine's API.
KB_POOL=0 KB_AGENT_IMAGE=$agent ndocker 1 stack deploy --resolve-image never -c deploy/swarm/stack.yaml kbswarm >/dev/null

ready() { curl -fsS -m 2 "http://$(node_ip "$1"):8080/healthz" >/dev/null 2>&1; }
wait_ready() {
  for _ in $(seq 1 240); do ready "$1" && return 0; sleep 0.5; done
  echo "the agent on node $1 did not become ready"; ndocker 1 service ps --no-trunc kbswarm_agent | head; return 1
}
t=$(now)
for n in 1 2 3; do wait_ready "$n"; done
for _ in $(seq 1 120); do curl -fsS -m 2 "$api/healthz" >/dev/null 2>&1 && break; sleep 0.5; done
say "stack deployed: three agents ready in $(since "$t") s"

# --- helpers over the API -----------------------------------------------------------------
# exec SESSION CODE -> prints the JSON result (status line first)
exec_() {
  curl -sS -m 120 -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -d "$(python3 -c 'import json,sys; print(json.dumps({"code": sys.argv[1]}))' "$2")" \
    "$api/v1/sessions/$1/execute"
}
field() { python3 -c "import json,sys
try: r=json.load(sys.stdin)
except Exception: print('unparsable'); sys.exit(0)
$1"; }
holder_of() { # the node name holding SESSION (from each node's kernels)
  for n in 1 2 3; do
    if curl -fsS -m 5 -H "Authorization: Bearer $admin" "http://$(node_ip "$n"):8080/v1/nodes/kbswarm-node$n/kernels" 2>/dev/null |
      grep -q "\"$1\""; then echo "kbswarm-node$n"; return; fi
  done
  echo none
}
# state_kept SESSION VALUE -> "kept" or the loss reason (or "error")
state_kept() {
  exec_ "$1" "print(x)" | field "k=r.get('kernel',{}); l=(k.get('state_lost') or {}).get('reason')
print(l if l else ('kept' if r.get('status')=='success' and r.get('output','').strip()=='$2' else 'error:'+str(r)[:200]))"
}
kernels_running() { # NODE -> running kernel containers' ids on that engine (via the host engine)
  docker exec "kbswarm-node$1" docker ps -q --filter label=io.kernelbox.role=kernel 2>/dev/null | sort
}
sessions_running() { # NODE -> running session kernels there (the warm pool's are no one's state)
  docker exec "kbswarm-node$1" docker ps -q --filter label=io.kernelbox.session 2>/dev/null | sort
}

# --- 1. sessions spread and keep state ----------------------------------------------------
say "1. twelve sessions through HAProxy"
for i in $(seq 1 12); do
  out=$(exec_ "s$i" "x = $i")
  echo "$out" | field "assert r['status']=='success', r" >/dev/null
done
declare -A holder
for i in $(seq 1 12); do holder[s$i]=$(holder_of "s$i"); done
spread=$(printf '%s\n' "${holder[@]}" | sort | uniq -c | tr '\n' ' ')
nodes_used=$(printf '%s\n' "${holder[@]}" | grep -v none | sort -u | wc -l)
say "   placement: $spread"
[ "$nodes_used" -ge 2 ] || { echo "sessions did not spread"; exit 1; }
for i in $(seq 1 12); do
  got=$(state_kept "s$i" "$i"); [ "$got" = kept ] || { echo "s$i: $got"; exit 1; }
done
say "   every session kept its state"

# --- 2. an engine killed ------------------------------------------------------------------
victim=3
lost_session=""
for i in $(seq 1 12); do [ "${holder[s$i]}" = "kbswarm-node$victim" ] && lost_session="s$i" && break; done
if [ -z "$lost_session" ]; then
  exec_ direct3 "x = 3" >/dev/null   # placed on node 3 when it has room
  lost_session=direct3
fi
old_kernels=$(kernels_running "$victim")
say "2. docker kill kbswarm-node$victim (holding $lost_session; $(echo "$old_kernels" | grep -c . ) kernels)"
t=$(now)
docker kill "kbswarm-node$victim" >/dev/null
reason=""
for _ in $(seq 1 240); do
  reason=$(exec_ "$lost_session" "print(1)" | field "print((r.get('kernel',{}).get('state_lost') or {}).get('reason'))")
  [ "$reason" = node_lost ] && break
  sleep 0.25
done
[ "$reason" = node_lost ] || { echo "no node_lost for $lost_session: $reason"; exit 1; }
kill_to_lost=$(since "$t")
say "   node_lost reported by a survivor after $kill_to_lost s"
docker start "kbswarm-node$victim" >/dev/null
wait_engine "$victim"
wait_ready "$victim"
back=$(kernels_running "$victim")
stale=$(comm -12 <(echo "$old_kernels") <(echo "$back") | grep -c . || true)
say "   node $victim back: its agent ready again; kernels of the old epoch running: $stale"
[ "$stale" -eq 0 ] || { echo "old-epoch kernels run"; exit 1; }

# --- 3. a partition -----------------------------------------------------------------------
part=2
exec_ part2 "x = 2" >/dev/null
part_session=""
for s in part2 $(printf 's%s ' $(seq 1 12)); do [ "$(holder_of "$s")" = "kbswarm-node$part" ] && part_session=$s && break; done
[ -n "$part_session" ] || { exec_ direct2 "x = 2" >/dev/null; part_session=direct2; }
before=$(sessions_running "$part" | grep -c . || true)
say "3. docker network disconnect kbswarm-node$part ($before session kernels)"
t=$(now)
docker network disconnect "$net" "kbswarm-node$part"
for _ in $(seq 1 240); do
  [ "$(sessions_running "$part" | grep -c . || true)" -eq 0 ] && break
  sleep 0.25
done
[ "$(sessions_running "$part" | grep -c . || true)" -eq 0 ] || { echo "node $part did not fence"; exit 1; }
part_to_fence=$(since "$t")
say "   node $part fenced itself (every kernel gone) after $part_to_fence s (lease TTL 10 s)"
# Swarm marks the node down (about 12 s); after the reconnect it starts a new agent task there
# while the old one still runs, for a while.
for _ in $(seq 1 240); do
  [ "$(ndocker 1 node inspect -f '{{.Status.State}}' "kbswarm-node$part")" = down ] && break
  sleep 0.5
done
docker network connect --ip "$(node_ip "$part")" "$net" "kbswarm-node$part"
t=$(now)
# While Swarm runs an old and a new agent task on the node, sample which of them serve (until
# the node is back to one agent that serves, after two were seen, or 60 s).
max_agents=0; both=0; rejoin=""
for _ in $(seq 1 120); do
  ids=$(docker exec "kbswarm-node$part" docker ps -q --filter label=com.docker.swarm.service.name=kbswarm_agent 2>/dev/null || true)
  count=$(echo "$ids" | grep -c . || true)
  [ "$count" -gt "$max_agents" ] && max_agents=$count
  if [ "$count" -gt 1 ]; then
    serving=0
    for id in $ids; do
      docker exec "kbswarm-node$part" docker exec "$id" python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8080/healthz", timeout=2)' >/dev/null 2>&1 && serving=$((serving + 1))
    done
    [ "$serving" -gt 1 ] && both=$((both + 1))
  fi
  if ready "$part"; then
    [ -z "$rejoin" ] && rejoin=$(since "$t")
    [ "$count" -eq 1 ] && [ "$max_agents" -ge 2 ] && break
  fi
  sleep 0.5
done
wait_ready "$part"
[ -n "$rejoin" ] || rejoin=$(since "$t")
reason=$(exec_ "$part_session" "print(1)" | field "print((r.get('kernel',{}).get('state_lost') or {}).get('reason'))")
say "   reconnected: ready again after $rejoin s; most agent tasks at once on the node: $max_agents, samples with two serving: $both; $part_session told: $reason"
[ "$both" -eq 0 ] || { echo "two agents served at once"; exit 1; }
[ "$reason" = node_lost ] || { echo "$part_session: expected node_lost, got $reason"; exit 1; }

# --- 4. rolling upgrades ------------------------------------------------------------------
# A client per session finishes its work during the upgrade: checks its state, then ends
# the session. Without drain the node under it is stopped at once; with drain it is served
# until it ends.
upgrade() { # LABEL IMAGE EXTRA-ARGS...
  local label=$1 image=$2; shift 2
  for i in $(seq 1 9); do exec_ "$label$i" "x = $i" | field "assert r['status']=='success', r" >/dev/null; done
  docker tag "$agent" "$image"
  for n in 1 2 3; do docker save "$image" | ndocker "$n" load -q >/dev/null; done
  local t0 lost=0
  t0=$(now)
  ndocker 1 service update --detach=true --no-resolve-image --image "$image" "$@" kbswarm_agent >/dev/null
  for i in $(seq 1 9); do
    sleep 2
    got=$(state_kept "$label$i" "$i")
    [ "$got" = kept ] || lost=$((lost + 1))
    curl -sS -m 30 -X DELETE -H "Authorization: Bearer $token" "$api/v1/sessions/$label$i" >/dev/null || true
  done
  for _ in $(seq 1 600); do
    state=$(ndocker 1 service inspect -f '{{if .UpdateStatus}}{{.UpdateStatus.State}}{{end}}' kbswarm_agent)
    [ "$state" = completed ] && break
    [ "$state" = paused ] && { echo "update paused"; exit 1; }
    sleep 0.5
  done
  for n in 1 2 3; do wait_ready "$n"; done
  echo "$lost $(since "$t0")" > "$work/upgrade"
}
say "4. rolling upgrade without drain (no --drain-deadline on the running agents)"
upgrade up1- kernelbox/agent:kbswarm-v2 --env-add KERNELBOX_DRAIN_DEADLINE=40s
read -r lost_plain dur_plain < "$work/upgrade"
say "   sessions that lost state: $lost_plain of 9; upgrade took $dur_plain s"
say "   rolling upgrade with drain (the running agents have --drain-deadline 40s)"
upgrade up2- kernelbox/agent:kbswarm-v3
read -r lost_drain dur_drain < "$work/upgrade"
say "   sessions that lost state: $lost_drain of 9; upgrade took $dur_drain s"
[ "$lost_drain" -eq 0 ] || { echo "sessions lost state despite the drain"; exit 1; }

cat <<SUMMARY

kbswarm summary
  engine killed to first node_lost (from a survivor)   $kill_to_lost s
  partition to fence (every kernel gone; TTL 10 s)     $part_to_fence s
  reconnect to ready again                              $rejoin s (two agents serving at once: $both samples)
  rolling upgrade without drain                         $dur_plain s, sessions lost $lost_plain of 9
  rolling upgrade with drain (deadline 40 s)            $dur_drain s, sessions lost $lost_drain of 9
  total                                                 $(( $(date +%s) - started )) s
SUMMARY
