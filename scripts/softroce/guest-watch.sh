# shellcheck shell=dash
# Guest-side text that e2e.sh and repeat.sh put before their guest scripts (the guest
# runs them with busybox sh): waiting for a run that may hang, and showing where.

# watch_run PID SECS: waits up to SECS seconds for background job PID and returns its
# exit status. A job still running then is taken as hung: the kernel stacks of its
# threads, of every task in D state and the kernel log's tail are printed, the job is
# killed, and the status is 124. A hang thus ends one run with what is needed to find
# its cause, instead of the guest's whole time.
watch_run() {
    watch_pid="$1"
    watch_limit="$2"
    watch_waited=0
    while kill -0 "$watch_pid" 2>/dev/null && [ "$watch_waited" -lt "$watch_limit" ]; do
        sleep 1
        watch_waited=$((watch_waited + 1))
    done
    if ! kill -0 "$watch_pid" 2>/dev/null; then
        wait "$watch_pid"
        return
    fi
    echo "HUNG: still running after $watch_limit s; its threads in the kernel:"
    for t in /proc/"$watch_pid"/task/*; do
        echo "thread $(cat "$t"/comm): $(grep State "$t"/status)"
        cat "$t"/stack
    done
    for t in /proc/[0-9]*; do
        case "$(grep State "$t"/status 2>/dev/null)" in
        *D*) echo "task in D state: $(cat "$t"/comm)" && cat "$t"/stack ;;
        esac
    done
    dmesg | tail -n 40
    kill -9 "$watch_pid"
    wait "$watch_pid" 2>/dev/null
    return 124
}
