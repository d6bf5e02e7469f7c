# shellcheck shell=bash
# Sourced by scripts/test: ends a host test binary that hangs, and shows where it sat,
# so a deadlock fails its stage in minutes with its stacks instead of costing CI's
# whole time (the Soft-RoCE stage has the same watch inside its guest: guest-watch.sh).

# watch_hung_tests DIR LIMIT: runs until killed. Every 5 s, a process whose executable
# is in DIR (cargo's test binaries, target/release/deps) and that has run LIMIT seconds
# or more is taken as hung: the user-space stacks of its threads (gdb), their kernel
# stacks, then SIGKILL, which cargo test reports as that binary's failure.
watch_hung_tests() {
    local dir="$1" limit="$2" proc pid exe age task
    while sleep 5; do
        for proc in /proc/[0-9]*; do
            exe="$(readlink "$proc/exe" 2>/dev/null)" || continue
            case "$exe" in "$dir"/*) ;; *) continue ;; esac
            pid="${proc#/proc/}"
            age="$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ')"
            if [ -z "$age" ] || [ "$age" -lt "$limit" ]; then
                continue
            fi
            {
                printf '\n==> HUNG: %s (pid %s) has run %s s, over the %s s limit; its threads:\n' \
                    "$exe" "$pid" "$age" "$limit"
                timeout 120 gdb -p "$pid" -batch -ex 'thread apply all bt' 2>&1 |
                    grep -E '^(Thread |#)' || echo "(gdb gave no stacks)"
                for task in "$proc"/task/*; do
                    echo "thread $(cat "$task/comm" 2>/dev/null) in the kernel:"
                    cat "$task/stack" 2>/dev/null || true
                done
                printf '==> killing pid %s\n' "$pid"
            } >&2
            kill -9 "$pid" 2>/dev/null || true
        done
    done
}
