# fanout's remote sandbox agent (POSIX sh).  fanout keeps one SSH channel per slot
# running this loop:  exec [unshare FLAGS] sh -c '<this script>' fanout ROOT KIND NETWORK FLAGS
# (FLAGS: the unshare flags that work on the host, "-" where none do; see launch) and
# sends it one unit at a time.  A unit costs no SSH handshake, no channel and no
# shell start-up: only what the unit itself needs.  Every process started here counts,
# so builtins are used wherever they can be.  fanout sends this file without comments.
#
# stdin, per unit: 1. one line: "TOKEN DEADLINE MARK SETUP", SETUP being shell code fanout
#                     generated with every value single-quoted (exports of env and
#                     secrets, the prompt, the functions worker, verify and collect);
#                  2. "<length>\n" and a tar of the staged files.
#        While a unit runs nothing else arrives, and stdin is the lifeline: at EOF
#        (fanout stopped, timed the unit out, or lost the connection) the unit's
#        processes are killed, its sandbox removed, and the agent exits.
# stdout, per unit: "worker RC", "verify RC", "timeout", "control LEN" + bytes,
#        "collect LEN" + tar bytes, and last "done TOKEN".  stderr: the worker's output,
#        then the end mark "\n\036fanout-end MARK\n".
#
# Secrets arrive in SETUP: they live in shell memory and the worker's environment,
# never in argv and never on disk.  Each unit runs in a subshell, so nothing of one
# unit (variables, functions, directory) reaches the next.
set -u
root=$1 kind=$2 network=$3 contain=$4
[ "$contain" = - ] && contain=''
# Clear the environment (sshd's variables, whatever the login shell's rc files
# exported): workers see only what the job declares, PATH aside.
remote_path=${PATH:-/usr/bin:/bin} remote_home=${HOME:-/nonexistent}
exported=$(export -p)
while IFS= read -r line; do
    case $line in
        'export '*) name=${line#export } ;;
        'declare -x '*) name=${line#declare -x } ;;
        *) continue ;;
    esac
    name=${name%%=*}
    case $name in ''|*[!A-Za-z0-9_]*) ;; *) unset "$name" 2>/dev/null ;; esac
done <<END_OF_EXPORTS
$exported
END_OF_EXPORTS
unset exported line name
export PATH="$remote_path"
umask 077
exec 3<&0 4>&1 1>&2
trap '' PIPE
nl='
'
base='' unit='' lifeline=''
cleanup() {
    if [ -n "$base" ]; then
        if [ -f "$base/pid" ]; then
            read -r pid < "$base/pid" && kill -s KILL -- "-$pid" "$pid" 2>/dev/null
        fi
        [ -n "$unit" ] && kill -s KILL "$unit" 2>/dev/null
        # What left the group still works in the sandbox: a worker's setsid'd process
        # where the host has no PID namespaces, or bwrap's sandbox process when bwrap
        # was killed before it had armed --die-with-parent (bwrap leaves that window
        # open).  Find it by its cwd (the agent's own /proc, in its namespace).
        for proc in $(find /proc -mindepth 2 -maxdepth 2 -name cwd -lname "$base/*" 2>/dev/null); do
            proc=${proc#/proc/}
            kill -s KILL "${proc%/cwd}" 2>/dev/null
        done
        cd / && rm -rf "$base"
    fi
    [ -n "$lifeline" ] && kill -s KILL "$lifeline" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 143' HUP INT TERM
say() { printf '%s\n' "$*" >&4; }

# launch ARGV...: run one step with the prompt on stdin, under the hard deadline, in a
# PID namespace of its own, so that its whole tree (a setsid'd daemon that left the
# sandbox directory too) dies when the step ends, is killed, or the agent dies: bwrap's,
# else unshare's.  Where the host has neither, in a process group of its own (timeout
# makes one), which a setsid'd process leaves.  Sets $rc (124: the deadline passed).
# unshare goes outside timeout: timeout is then the namespace's first process, so the
# deadline's TERM reaches the worker as it would anywhere (a first process ignores
# signals it has no handler for), and when timeout ends the namespace goes with it.
launch() {
    if [ "$kind" = bwrap ]; then
        net=''
        [ "$network" = 1 ] && net=--share-net
        hide=''
        [ -d "$remote_home/.ssh" ] && hide=$remote_home/.ssh
        set -- bwrap --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --tmpfs /var/tmp \
            ${hide:+--tmpfs "$hide"} --bind "$base" "$base" --chdir "$base/work" \
            --unshare-all $net --die-with-parent --new-session -- "$@"
        set -- timeout -k 2 "$deadline" "$@"
    elif [ -n "$contain" ]; then
        set -- unshare $contain -- timeout -k 2 "$deadline" "$@"
    else
        set -- timeout -k 2 "$deadline" "$@"
    fi
    (trap - PIPE; exec "$@") < "$base/prompt" 2>&1 3<&- 4>&- &
    worker=$!
    echo "$worker" > "$base/pid"
    wait "$worker"
    rc=$?
    kill -s KILL -- "-$worker" 2>/dev/null  # what the step left running in its group
}

collect_files() {  # collect_files FIND-TESTS...: tar the matching files and symlinks to fanout
    find . -regextype posix-extended \( "$@" \) -print0 \
        | tar --null -T - -c -f "$base/collect.tar" || exit 77
    say "collect $(wc -c < "$base/collect.tar")"
    cat "$base/collect.tar" >&4
}

run_unit() {  # the body of one unit, in a subshell
    eval "$setup"
    unset setup
    printf '%s' "$prompt" > "$base/prompt"
    unset prompt
    export FANOUT_CONTROL="$base/control.json"
    if [ "$kind" = bwrap ]; then
        export HOME=/tmp TMPDIR=/tmp
    else
        export HOME="$base/home" TMPDIR="$base/home"
    fi
    cd "$base/work" || exit 75
    worker
    say "worker $rc"
    if [ "$rc" -eq 0 ] && command -v verify > /dev/null 2>&1; then
        verify
        say "verify $rc"
    fi
    [ "$rc" -eq 124 ] && say timeout
    if [ -f "$base/control.json" ]; then
        say "control $(wc -c < "$base/control.json")"
        cat "$base/control.json" >&4
    fi
    if [ "$rc" -eq 0 ] && command -v collect > /dev/null 2>&1; then
        collect
    fi
}

while IFS=' ' read -r token deadline mark setup <&3; do
    case $token$deadline$mark in ''|*[!0-9a-f]*) exit 72 ;; esac
    # TOKEN is 64 random bits from fanout: nobody can have created this path in advance.
    base=$root/fanout-$token
    if ! mkdir -m 700 "$base" "$base/work" "$base/home" 2>/dev/null; then
        base=''
        say "error cannot create a sandbox in $root (sandboxRoot must be a writable directory)"
        exit 70
    fi
    IFS= read -r length <&3 || exit 71
    case $length in ''|*[!0-9]*) exit 72 ;; esac
    if [ "$length" -gt 0 ]; then
        head -c "$length" <&3 | tar -x --no-same-owner -f - -C "$base/work" || exit 76
    fi
    # The lifeline: EOF on stdin while the unit runs TERMs this shell; its trap cleans up.
    (trap - PIPE; while IFS= read -r _; do :; done; kill -s TERM $$) <&3 > /dev/null 2>&1 4>&- &
    lifeline=$!
    (trap - PIPE; run_unit) 3<&- &
    unit=$!
    unset setup
    wait "$unit"
    unit=''
    kill -s KILL "$lifeline" 2>/dev/null
    wait "$lifeline" 2>/dev/null
    lifeline=''
    cd / && rm -rf "$base"
    base=''
    # The end of this unit's output; MARK is never shown to the worker.
    printf '\n\036fanout-end %s\n' "$mark"
    say "done $token"
done
