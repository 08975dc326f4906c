#!/bin/busybox sh
# The kernel matrix's work in the arm64 guest, whose root filesystem is busybox and the agent's
# libraries only (no systemd): its /init mounts the payload disk at /payload and runs this, then
# powers off. It starts the agent from the payload, makes one cgroup whose process exits with a
# code, and writes what the agent answered into /payload/results for the host
# (lifecycle-agent/tests/matrix.rs) to judge. It judges nothing; every wait has a deadline.
set -u
bb=/bin/busybox
results=/payload/results
$bb mkdir -p $results
start=$($bb cut -d' ' -f1 /proc/uptime)

# GET $1 into $2 when answered 200, with nc (busybox's static wget segfaults in this guest).
# The request goes through a FIFO whose writer stays open until the answer is in: nc half-closes
# the connection at the end of its input, and the agent's HTTP server may then drop the answer.
$bb mkfifo /tmp/request
fetch() {
  (printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" && exec $bb sleep 60) >/tmp/request &
  writer=$!
  $bb nc 127.0.0.1 9890 </tmp/request >/tmp/answer 2>/dev/null
  $bb kill $writer 2>/dev/null
  wait $writer 2>/dev/null
  $bb head -n 1 /tmp/answer | $bb grep -q ' 200 ' || return 1
  $bb sed '1,/^\r$/d' /tmp/answer >"$2"
}

# Up to $1 tries a quarter-second apart of the command after it.
poll() {
  tries=$1
  shift
  while [ "$tries" -gt 0 ]; do
    "$@" && return 0
    tries=$((tries - 1))
    $bb usleep 250000
  done
  return 1
}

$bb mkdir -p /sys/fs/cgroup
$bb mount -t cgroup2 cgroup2 /sys/fs/cgroup
$bb ifconfig lo 127.0.0.1 up
{
  echo "uname=$($bb uname -r)"
  echo "proc_version=$($bb cat /proc/version)"
  echo "uptime_at_check=$start"
} >$results/facts.env

# The image's tree, as a container of it would see the host: the kernel's file systems bound in.
root=/payload/rootfs
$bb mount -t proc proc $root/proc
$bb mount -o rbind /sys $root/sys
$bb mount -o bind /dev $root/dev
$bb chroot $root /usr/local/bin/lifecycle-agent run --listen 127.0.0.1:9890 --handoff-dir none >$results/agent.stdout 2>$results/agent.log &
agent=$!
healthy() { fetch /healthz /dev/null || ! $bb kill -0 $agent 2>/dev/null; }
poll 720 healthy
if fetch /healthz /dev/null; then
  echo "agent_started=1" >>$results/facts.env
  fetch /metrics $results/metrics-start.txt
  # One process in a cgroup of its own, exiting with code 7.
  $bb mkdir /sys/fs/cgroup/matrix-exit
  $bb sh -c 'echo $$ > /sys/fs/cgroup/matrix-exit/cgroup.procs; exec /bin/busybox sh -c "exit 7"'
  echo "exit_status=$?" >>$results/facts.env
  # Settled once the exit code is exported for the cgroup.
  seen() { fetch /metrics $results/metrics.txt && $bb grep -q '^lifecycle_container_last_terminated_exit_code{.*container="/matrix-exit"' $results/metrics.txt; }
  poll 240 seen
  fetch /api/v1/containers $results/containers.json
  fetch /metrics $results/metrics.txt
  $bb kill -TERM $agent
  wait $agent
  echo "agent_exit_at_stop=$?" >>$results/facts.env
  $bb rmdir /sys/fs/cgroup/matrix-exit
else
  echo "agent_started=0" >>$results/facts.env
  if $bb kill -0 $agent 2>/dev/null; then
    $bb kill -KILL $agent
  else
    wait $agent
    echo "agent_exit_at_start=$?" >>$results/facts.env
  fi
fi
$bb dmesg >$results/dmesg.txt
end=$($bb cut -d' ' -f1 /proc/uptime)
echo "check_seconds=$($bb awk "BEGIN { print $end - $start }")" >>$results/facts.env
$bb sync
