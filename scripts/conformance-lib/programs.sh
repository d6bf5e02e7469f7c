# shellcheck shell=bash
# program_results and program_failed are read by scripts/conformance, which sources this.
# shellcheck disable=SC2034
# The real-program stage of scripts/conformance (sourced, not run): bigger versions of
# tests/tests/programs.rs on one rmemfs mount whose cache is smaller than the work.
#
#   programs_stage MOUNT WORK LOGS TREE
#
# MOUNT is a live rmemfs mount, WORK a local scratch directory, LOGS where each
# program's log goes, TREE a source tree to archive (at least 50 MiB is wanted: copies
# of it are archived together when it is smaller). Each program adds one line to the
# array program_results (`NAME: ok|FAILED (what, timings)`) and sets program_failed=1
# when it fails. Every check is the program's own verdict or a comparison with the
# same work on local disk. Each program runs in a subshell that stops at the first
# failing step; a step's time goes to a file the summary line reads.

program_results=()
program_failed=0

# now: seconds since the epoch with fractions, for timings.
now() { date +%s.%N; }
# since T0: seconds elapsed since T0, one decimal.
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

program_result() { # NAME STATUS DETAILS
    program_results+=("$(printf '%-7s %s (%s)' "$1:" "$2" "$3")")
    if [ "$2" != ok ]; then
        program_failed=1
    fi
}

# step NAME CMD...: runs CMD; on success appends `NAME SECONDS` to $times, on failure
# says which step failed and leaves the program's subshell.
step() {
    local name=$1 t0
    shift
    t0=$(now)
    if ! "$@"; then
        echo "step $name failed: $*"
        exit 1
    fi
    echo "$name $(since "$t0")" >>"$times"
}
# took NAME: the seconds step NAME took.
took() { awk -v n="$1" '$1 == n { print $2 }' "$times"; }

drop_caches() { sync && echo 3 >/proc/sys/vm/drop_caches; }

# git with no system or user configuration and a fixed identity.
pgit() {
    GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null \
        GIT_AUTHOR_NAME=rmemfs GIT_AUTHOR_EMAIL=dev@rmemfs \
        GIT_COMMITTER_NAME=rmemfs GIT_COMMITTER_EMAIL=dev@rmemfs \
        git -c init.defaultBranch=main -c gc.auto=0 "$@"
}

# fsck that must exit 0 and say nothing.
pgit_fsck() { # REPO
    local out
    out=$(pgit -C "$1" fsck --full --strict --no-dangling 2>&1) || { echo "$out"; return 1; }
    [ -z "$out" ] || { echo "git fsck $1: $out"; return 1; }
}

# tar of a directory's contents that is the same for the same tree: sorted names,
# numeric ids, GNU format (no atime or ctime).
ptar_create() { # DIR ARCHIVE
    tar --sort=name --format=gnu --numeric-owner -C "$1" -cf "$2" .
}

tar_run() ( # MOUNT WORK TREE COPIES
    local mnt=$1 work=$2 tree=$3 copies=$4 i
    for i in $(seq 1 "$copies"); do
        step copy cp -a "$tree" "$work/tar-src/copy-$i"
    done
    step archive ptar_create "$work/tar-src" "$work/original.tar"
    step mkdir mkdir "$mnt/tree"
    step extract tar -C "$mnt/tree" -xf "$work/original.tar"
    step drop drop_caches
    step retar ptar_create "$mnt/tree" "$mnt/again.tar"
    step drop drop_caches
    step cmp cmp "$work/original.tar" "$mnt/again.tar"
    step diff diff -r --no-dereference "$work/tar-src" "$mnt/tree"
)

program_tar() { # MOUNT WORK LOGS TREE
    local mnt=$1 work=$2 log=$3/programs-tar.log tree=$4 size copies=1 files rc=0
    local times=$work/times-tar
    : >"$times"
    mkdir -p "$work/tar-src"
    size=$(du -sb "$tree" | cut -f1)
    if [ "$size" -lt $((50 << 20)) ]; then
        copies=$(((50 << 20) / (size + 1) + 1))
    fi
    files=$(find "$tree" -type f | wc -l)
    tar_run "$mnt" "$work" "$tree" "$copies" >"$log" 2>&1 || rc=$?
    local what="$((files * copies)) files, $((size * copies >> 20)) MiB from $tree"
    if [ "$copies" -gt 1 ]; then
        what+=" ($copies copies)"
    fi
    if [ "$rc" -eq 0 ]; then
        program_result tar ok "$what: extract $(took extract)s, re-tar onto the mount $(took retar)s, archives equal, diff -r clean $(took diff)s"
    else
        program_result tar FAILED "$what; log $log"
    fi
    rm -rf "$work/tar-src" "$work/original.tar"
}

commit_change() { # REPO N
    head -c $(($2 * 4099)) /dev/urandom | base64 >"$1/change-$2.txt" &&
        if [ "$2" -gt 1 ]; then pgit -C "$1" rm -q "change-$(($2 - 1)).txt"; fi &&
        pgit -C "$1" add -A && pgit -C "$1" commit -q -m "change $2"
}
commit_series() { # REPO
    local n
    for n in $(seq 1 20); do
        commit_change "$1" "$n" || return 1
    done
}
clean_status() { [ -z "$(pgit -C "$1" status --porcelain)" ]; }
same_head() { [ "$(pgit -C "$1" rev-parse HEAD)" = "$(pgit -C "$2" rev-parse HEAD)" ]; }

git_run() ( # MOUNT WORK REPO
    local mnt=$1 work=$2 repo=$3 clone=$1/git-clone big=$1/tree
    step clone pgit clone -q --no-local "$repo" "$clone"
    step commits commit_series "$clone"
    step fsck1 pgit_fsck "$clone"
    step init pgit -C "$big" init -q
    step add pgit -C "$big" add -A
    step commit pgit -C "$big" commit -q -m "the extracted tree"
    step gc pgit -C "$big" gc -q
    step gc2 pgit -C "$clone" gc -q
    step drop drop_caches
    step fsck pgit_fsck "$big"
    step fsck2 pgit_fsck "$clone"
    step status clean_status "$big"
    step back pgit clone -q --no-local "$clone" "$work/git-back"
    step fsck3 pgit_fsck "$work/git-back"
    step head same_head "$clone" "$work/git-back"
)

program_git() { # MOUNT WORK LOGS REPO
    local mnt=$1 work=$2 log=$3/programs-git.log repo=$4 rc=0 n
    local times=$work/times-git
    : >"$times"
    git_run "$mnt" "$work" "$repo" >"$log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then
        n=$(pgit -C "$mnt/tree" ls-files | wc -l)
        program_result git ok "clone of this repository $(took clone)s, 20 commits $(took commits)s; git init, add, commit of the tar tree ($n files tracked) $(took add)s + $(took commit)s, gc $(took gc)s; fsck --full --strict clean $(took fsck)s; cloned back, same HEAD"
    else
        program_result git FAILED "log $log"
    fi
    rm -rf "$work/git-back"
}

# The SQL of the SQLite run: 20 transactions of 10,000 rows with an index, a rollback,
# a transaction of updates and deletes.
sqlite_sql() { # JOURNAL
    echo "PRAGMA journal_mode=$1; PRAGMA cache_size=64;"
    echo "CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER NOT NULL, v TEXT NOT NULL);"
    echo "CREATE INDEX t_k ON t(k);"
    for tx in $(seq 1 20); do
        echo "BEGIN; WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i<10000)"
        echo "INSERT INTO t(k, v) SELECT (i * 7919 + $tx) % 100003, printf('%.*c-%d-%d', 40 + i % 300, 'x', $tx, i) FROM c; COMMIT;"
    done
    echo "BEGIN; DELETE FROM t WHERE k % 3 = 0; UPDATE t SET v = 'gone'; ROLLBACK;"
    echo "BEGIN; UPDATE t SET v = v || '+' WHERE id % 10 = 0; DELETE FROM t WHERE id % 97 = 0; COMMIT;"
}
sqlite_verdict='PRAGMA integrity_check; SELECT count(*), sum(k), total(length(v)) FROM t;'

sqlite_build() { # JOURNAL DB OUT
    { sqlite_sql "$1" | sqlite3 -batch -bail "$2" && sqlite3 "$2" "$sqlite_verdict"; } >"$3"
}
integrity_ok() { grep -qx ok "$1"; }
same_verdict() { [ "$(tail -n 2 "$1")" = "$(sqlite3 "$2" "$sqlite_verdict")" ]; }
same_dump() { cmp <(sqlite3 "$1" .dump) <(sqlite3 "$2" .dump); }

sqlite_run() ( # MOUNT WORK JOURNAL
    local mnt=$1 work=$2 j=$3
    step "local-$j" sqlite_build "$j" "$work/$j.db" "$work/$j.local.out"
    step "$j" sqlite_build "$j" "$mnt/$j.db" "$work/$j.mount.out"
    step "ok-$j" integrity_ok "$work/$j.mount.out"
    step "answers-$j" cmp "$work/$j.local.out" "$work/$j.mount.out"
    step drop drop_caches
    step "again-$j" same_verdict "$work/$j.mount.out" "$mnt/$j.db"
    step "dump-$j" same_dump "$work/$j.db" "$mnt/$j.db"
)

program_sqlite() { # MOUNT WORK LOGS
    local mnt=$1 work=$2 log=$3/programs-sqlite.log j rc=0
    local times=$work/times-sqlite
    : >"$times"
    : >"$log"
    for j in delete wal; do
        sqlite_run "$mnt" "$work" "$j" >>"$log" 2>&1 || rc=$?
    done
    local what="200,000 rows in 20 transactions and a rollback, in a rollback journal and in WAL"
    if [ "$rc" -eq 0 ]; then
        program_result sqlite ok "$what: $(took delete)s and $(took wal)s; integrity_check ok, answers and dump equal local disk's, also after drop_caches"
    else
        program_result sqlite FAILED "$what; log $log"
    fi
}

# cargo of this run, with nothing of the caller's build leaking in.
pcargo() {
    env -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR -u RUSTFLAGS CARGO_NET_OFFLINE=true \
        cargo "$@"
}
hello_runs() { [ "$("$1")" = "Hello, world!" ]; }
copy_workspace() { # FROM TO
    mkdir "$2" && git -C "$1" ls-files -z | (cd "$1" && xargs -0 cp --parents -t "$2")
}
in_dir() { # DIR CMD...
    (cd "$1" && shift && "$@")
}

# PACKAGE: the workspace package to build with its dependencies, whose binary of the
# same name then runs; empty for the whole workspace, whose fsd then runs.
cargo_run() ( # MOUNT WORKSPACE PACKAGE
    local mnt=$1 ws=$2 pkg=$3
    step new in_dir "$mnt" pcargo new --vcs none hello-rmemfs
    step build in_dir "$mnt/hello-rmemfs" pcargo build --offline
    step run hello_runs "$mnt/hello-rmemfs/target/debug/hello-rmemfs"
    step copy copy_workspace "$ws" "$mnt/workspace"
    if [ -n "$pkg" ]; then
        step workspace in_dir "$mnt/workspace" pcargo build --offline -p "$pkg"
        step binary "$mnt/workspace/target/debug/$pkg" --help
    else
        step workspace in_dir "$mnt/workspace" pcargo build --offline --workspace
        step binary "$mnt/workspace/target/debug/fsd" --help
    fi
)

program_cargo() { # MOUNT WORK LOGS WORKSPACE PACKAGE
    local mnt=$1 work=$2 log=$3/programs-cargo.log ws=$4 pkg=$5 rc=0
    local times=$work/times-cargo what
    : >"$times"
    if [ -n "$pkg" ]; then
        what="this workspace's $pkg with its dependencies"
    else
        what="this workspace with its dependencies"
    fi
    cargo_run "$mnt" "$ws" "$pkg" >"$log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then
        program_result cargo ok "cargo new, build $(took build)s, run; $what (offline, from the registry) built on the mount $(took workspace)s, its ${pkg:-fsd} runs"
    else
        program_result cargo FAILED "log $log"
    fi
}

# getfacl of every path under DIR, relative, numeric, in name order (not readdir's):
# the same for the same ACLs, modes and owners.
acl_listing() { # DIR
    (cd "$1" && find . -print0 | LC_ALL=C sort -z | xargs -0 getfacl -n -p)
}

# acl_tree DIR: files and directories with access and default ACLs, named users and
# groups, masks narrower than the mode.
acl_tree() {
    mkdir -p "$1/shared/sub" "$1/private"
    echo data >"$1/shared/a"
    echo more >"$1/private/b"
    setfacl -m u:65534:rw,g:65534:r "$1/shared/a"
    setfacl -m u:65534:rx,m::r "$1/private"
    setfacl -d -m u:65534:rwx,g::rx,o::- "$1/shared"
    touch "$1/shared/sub/inherited-by-creation"
}

acl_run() ( # MOUNT WORK
    local mnt=$1 work=$2
    step local-tree acl_tree "$work/acl-src"
    step listing eval 'acl_listing "$work/acl-src" >"$work/acl-want"'
    step archive tar --acls --numeric-owner -C "$work/acl-src" -cf "$work/acl.tar" .
    step mkdir mkdir "$mnt/acl-tar"
    # tar only warns when it cannot set an ACL: any word from it is a failure.
    step extract eval 'tar --acls --numeric-owner -p -C "$mnt/acl-tar" -xf "$work/acl.tar" 2>&1 | tee "$work/acl-tar.err"; [ ! -s "$work/acl-tar.err" ]'
    step drop drop_caches
    step tar-listing eval 'acl_listing "$mnt/acl-tar" >"$work/acl-got-tar"'
    step tar-same diff "$work/acl-want" "$work/acl-got-tar"
    step copy cp -a "$work/acl-src" "$mnt/acl-cp"
    step cp-listing eval 'acl_listing "$mnt/acl-cp" >"$work/acl-got-cp"'
    step cp-same diff "$work/acl-want" "$work/acl-got-cp"
    # Created on the mount under the default ACL, then compared with the same on disk.
    step create-local eval 'umask 077; touch "$work/acl-src/shared/new"; mkdir "$work/acl-src/shared/newdir"'
    step create-mount eval 'umask 077; touch "$mnt/acl-cp/shared/new"; mkdir "$mnt/acl-cp/shared/newdir"'
    step inherited diff <(acl_listing "$work/acl-src") <(acl_listing "$mnt/acl-cp")
)

program_acl() { # MOUNT WORK LOGS
    local mnt=$1 work=$2 log=$3/programs-acl.log rc=0
    local times=$work/times-acl
    : >"$times"
    # The same tree on the local disk is the reference: it must take ACLs too.
    mkdir -p "$work/acl-probe"
    if ! setfacl -m u:65534:r "$work/acl-probe" 2>"$log"; then
        program_result acl FAILED "the local disk under $work takes no ACLs to compare with; log $log"
        return
    fi
    acl_run "$mnt" "$work" >>"$log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then
        program_result acl ok "tar --acls and cp -a onto the mount keep every ACL, new files inherit default ACLs as on local disk"
    else
        program_result acl FAILED "log $log"
    fi
    rm -rf "$work/acl-src" "$work/acl-probe" "$work/acl.tar" "$work"/acl-want "$work"/acl-got-* "$work/acl-tar.err"
}

programs_stage() { # MOUNT WORK LOGS TREE REPO CARGO_PACKAGE
    local mnt=$1 work=$2 logs=$3 tree=$4 repo=$5 cargo_package=$6
    log "programs: tar (a copy of $tree)"
    program_tar "$mnt" "$work" "$logs" "$tree"
    log "programs: acl (tar --acls, cp -a, default ACLs)"
    program_acl "$mnt" "$work" "$logs"
    log "programs: git"
    program_git "$mnt" "$work" "$logs" "$repo"
    log "programs: sqlite"
    program_sqlite "$mnt" "$work" "$logs"
    log "programs: cargo"
    program_cargo "$mnt" "$work" "$logs" "$repo" "$cargo_package"
}
