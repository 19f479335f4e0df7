#!/usr/bin/env bash
# Multi-node as users run it, on one machine. Two network namespaces act as the hosts
# nodeA and nodeB: each has its own host name (a UTS namespace), its own loopback and one
# end of a veth pair (10.213.77.1 and .2). mpirun runs on nodeA and starts Open MPI's
# daemon on nodeB through netns_rsh.sh instead of ssh; out-of-band and MPI traffic are
# held to the veth subnet, so ranks on different hosts talk over TCP.
# `tripod train` runs TP2 inside each node and PP2 across them (4 ranks, 2 per node, filled
# in rank order) and the test checks:
#  1. where each rank runs, independently of tripod: host name, network namespace and
#     Open MPI's node-local rank and size;
#  2. tripod's placement lines agree: host of each rank, node-local ranks 0-1 of 2, TP
#     inside a host and PP across, and no warning;
#  3. the pipeline's activations crossed the veth (its byte counters);
#  4. per-iteration loss and grad norm equal the single-rank run's on the same global
#     batch within relative 1e-5 (tests/engine/train/test_equivalence.cc's tolerance).
# Exits 77 (skipped) where namespaces cannot be made: not root, no `ip`, no CAP_NET_ADMIN.
# Every step is bounded by `timeout`, and the namespaces and the processes inside them are
# removed on exit (and swept at the next start, should a run be killed outright).
# usage: multinode.sh TRIPOD_BIN SOURCE_DIR
set -u
bin=$1
src=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/flow_lib.sh"
skip() {
  echo "multinode: SKIP: $*"
  exit 77
}

for tool in ip unshare hostname mpirun timeout awk; do
  command -v "$tool" >/dev/null || skip "no '$tool' on the PATH (tools/setup.sh installs it)"
done

prefix=tripod-mn
# namespaces left by a run that was killed before its trap ran (its process is gone)
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-[0-9]*-node"); do
  owner=${ns#"$prefix"-}
  owner=${owner%%-*}
  if ! kill -0 "$owner" 2>/dev/null; then
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  fi
done

flow_begin multinode
nodes=(nodeA nodeB)
made=()
job=
cleanup() {
  [ -n "$job" ] && kill -9 -- -"$job" 2>/dev/null # timeout leads a process group of its own
  for ns in "${made[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# SECONDS COMMAND...: in the background, so that a signal to this script runs the trap at
# once (bash holds traps while a foreground command runs)
bounded() {
  local limit=$1
  shift
  timeout -k 10 "$limit" "$@" &
  job=$!
  wait "$job"
  local rc=$?
  job=
  return $rc
}

ns_of() { echo "$prefix-$$-$1"; }
for n in "${nodes[@]}"; do
  err=$(ip netns add "$(ns_of "$n")" 2>&1) ||
    skip "cannot create a network namespace ($err): needs root or CAP_NET_ADMIN and CAP_SYS_ADMIN"
  made+=("$(ns_of "$n")")
done
nsA=$(ns_of nodeA)
nsB=$(ns_of nodeB)
vA=tpd$$a # interface names: 15 characters at most
vB=tpd$$b
err=$(ip link add "$vA" netns "$nsA" type veth peer name "$vB" netns "$nsB" 2>&1) ||
  skip "cannot create a veth pair between the namespaces ($err)"
subnet=10.213.77.0/24
ip -n "$nsA" addr add 10.213.77.1/24 dev "$vA" || fail "cannot address $vA"
ip -n "$nsB" addr add 10.213.77.2/24 dev "$vB" || fail "cannot address $vB"
for ns in "$nsA" "$nsB"; do ip -n "$ns" link set lo up || fail "cannot bring up lo in $ns"; done
ip -n "$nsA" link set "$vA" up && ip -n "$nsB" link set "$vB" up || fail "cannot bring up the veth"

printf 'nodeA %s\nnodeB %s\n' "$nsA" "$nsB" >"$work/netns.map"
printf 'nodeA slots=2\nnodeB slots=2\n' >"$work/hosts"
export TRIPOD_NETNS_MAP=$work/netns.map OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# mpirun on nodeA; ranks fill nodeA's slots first (rank order = host order in the file)
on_nodeA=(ip netns exec "$nsA" unshare --uts sh -c 'hostname nodeA && exec "$@"' sh)
mpirun=(mpirun --hostfile "$work/hosts" -np 4 --map-by slot --bind-to none
  --mca plm_rsh_agent "$here/netns_rsh.sh" --mca plm_rsh_no_tree_spawn 1
  --mca oob_tcp_if_include "$subnet" --mca btl_tcp_if_include "$subnet"
  --mca pml ob1 --mca btl self,vader,tcp -x OMP_NUM_THREADS=1)

# 1. where the ranks run, as the system sees it
bounded 60 "${on_nodeA[@]}" "${mpirun[@]}" sh -c \
  'echo "$OMPI_COMM_WORLD_RANK $(hostname) $(readlink /proc/self/ns/net) $OMPI_COMM_WORLD_LOCAL_RANK $OMPI_COMM_WORLD_LOCAL_SIZE"' \
  >"$work/where.txt" 2>&1 || fail "mpirun into the namespaces failed: $(head -c 2000 "$work/where.txt")"
netA=$(ip netns exec "$nsA" readlink /proc/self/ns/net)
netB=$(ip netns exec "$nsB" readlink /proc/self/ns/net)
for want in "0 nodeA $netA 0 2" "1 nodeA $netA 1 2" "2 nodeB $netB 0 2" "3 nodeB $netB 1 2"; do
  grep -qxF -- "$want" "$work/where.txt" || fail "no rank line '$want' in: $(cat "$work/where.txt")"
done
echo "ranks 0-1 on nodeA ($netA), 2-3 on nodeB ($netB), local ranks 0-1 of 2 on each"

# 2-4. train TP2 x PP2 across the two nodes, and on one rank
flow_corpus "$bin" 200
common=(data.data_path="$work/corpus" model.num_layers=4 model.hidden_size=32
  model.num_attention_heads=4 model.seq_length=16 training.micro_batch_size=1
  training.global_batch_size=8 training.train_iters=10 logging.log_interval=1
  logging.eval_interval=0 checkpoint.save= comm.timeout_s=60)
bytes() { ip netns exec "$nsA" cat "/sys/class/net/$vA/statistics/$1_bytes"; }
tx0=$(bytes tx)
rx0=$(bytes rx)
bounded 240 "${on_nodeA[@]}" "${mpirun[@]}" "$bin" train "$src/configs/demo.yaml" \
  "${common[@]}" parallel.tensor_model_parallel_size=2 parallel.pipeline_model_parallel_size=2 \
  logging.metrics_file="$work/multi.jsonl" >"$work/multi.log" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "TP2 x PP2 across nodeA and nodeB exited $rc: $(tail -c 3000 "$work/multi.log")"
tx=$(($(bytes tx) - tx0))
rx=$(($(bytes rx) - rx0))
grep -F 'placement:' "$work/multi.log"
expect_line() {
  grep -qF -- "$1" "$work/multi.log" || fail "no line '$1' in the training log: $(grep -F placement "$work/multi.log")"
}
expect_line "placement: 4 ranks on 2 hosts; TP groups inside one host, PP groups span hosts, DP groups inside one host"
expect_line "placement: host nodeA: ranks 0-1 (local ranks 0-1 of 2)"
expect_line "placement: host nodeB: ranks 2-3 (local ranks 0-1 of 2)"
if grep -q 'warning: placement' "$work/multi.log"; then
  fail "placement warnings: $(grep 'warning: placement' "$work/multi.log")"
fi
# stage 0 sends each micro-batch's activations (seq 16 x hidden 32 fp32 = 2 KiB) to stage
# 1 and gets their gradients back: at least 10 steps x 8 micro-batches x 2 KiB each way
# for one of the two TP pairs
least=$((10 * 8 * 16 * 32 * 4))
[ "$tx" -ge "$least" ] && [ "$rx" -ge "$least" ] ||
  fail "the veth carried $tx bytes out of nodeA and $rx in; the pipeline alone needs $least each way"
echo "veth nodeA->nodeB: $tx bytes out, $rx bytes in (pipeline activations alone: $least)"

bounded 120 "$bin" train "$src/configs/demo.yaml" "${common[@]}" \
  logging.metrics_file="$work/one.jsonl" >"$work/one.log" 2>&1 ||
  fail "the single-rank run failed: $(tail -c 2000 "$work/one.log")"
field() { grep -o "\"$1\":[^,}]*" "$2" | cut -d: -f2; }
paste <(field lm_loss "$work/one.jsonl") <(field lm_loss "$work/multi.jsonl") \
  <(field grad_norm "$work/one.jsonl") <(field grad_norm "$work/multi.jsonl") >"$work/cmp.txt"
awk 'function rel(a, b) { d = (a - b) / b; return d < 0 ? -d : d }
     NF == 4 { n++; e = rel($2, $1); g = rel($4, $3); if (e > wl) wl = e; if (g > wg) wg = g
               if (e > 1e-5 || g > 1e-5) { printf "iteration %d: loss %s vs %s, grad norm %s vs %s\n", n, $2, $1, $4, $3; bad++ } }
     END { printf "%d iterations, worst relative error: loss %.2e, grad norm %.2e\n", n, wl, wg
           exit (n != 10 || bad > 0) }' "$work/cmp.txt" ||
  fail "TP2 x PP2 across two nodes does not match the single-rank run"
echo "multinode: PASS"
