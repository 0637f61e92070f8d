# fanout's remote sandbox wrapper (POSIX sh).  Sent as the command of one SSH channel
# per attempt: sh -c '<this script>' fanout ROOT TIMEOUT KIND NETWORK
#
# stdin  : frames "<kind> <length>\n<bytes>" (env, prompt, stage, argv, verify,
#          collect), then "run 0\n"; after that stdin stays open as the lifeline: when
#          it reaches EOF (fanout stopped, timed out or lost the connection) every
#          process of the unit is killed.
# stdout : protocol lines for fanout: "worker RC", "verify RC", "timeout", then
#          "control LEN" and "collect LEN" frames, then "done".
# stderr : the worker's output (stdout and stderr).
#
# The sandbox directory is removed on every exit path.  Secrets arrive as env frames and
# live only in this shell's memory and the worker's environment: never in argv, never
# on disk.
set -u
root=$1 timeout=$2 kind=$3 network=$4
umask 077
exec 3<&0 4>&1 1>&2
base=$(mktemp -d "$root/fanout-XXXXXXXX") || { echo "fanout: cannot create a sandbox in $root" >&2; exit 70; }
worker=''
watchers=''
cleanup() {
    [ -n "$worker" ] && kill -KILL -- "-$worker" 2>/dev/null
    for w in $watchers; do kill -KILL -- "-$w" 2>/dev/null; done
    rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 143' HUP INT TERM
mkdir "$base/work" "$base/home"
say() { printf '%s\n' "$*" >&4; }

# Remember the remote login PATH and HOME, then clear the environment: the worker sees
# only what the job declares.
remote_path=${PATH:-/usr/bin:/bin}
remote_home=${HOME:-/nonexistent}
for name in $(env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p'); do
    case $name in PATH|IFS|PS1|PS2|PS4|PPID|OPTIND) ;; *) unset "$name" 2>/dev/null ;; esac
done

readframe() {  # readframe VAR -> $frame_kind, VAR holds the payload
    IFS=' ' read -r frame_kind frame_len <&3 || exit 71
    case $frame_len in ''|*[!0-9]*) exit 72 ;; esac
    if [ "$frame_len" -gt 0 ]; then
        eval "$1=\$(head -c \"\$frame_len\" <&3; echo x)"
        eval "$1=\${$1%x}"
    else
        eval "$1=''"
    fi
}

argc=0 verifyc=0 collectc=0
while :; do
    IFS=' ' read -r frame_kind frame_len frame_name <&3 || exit 71
    case $frame_len in ''|*[!0-9]*) exit 72 ;; esac
    case $frame_kind in
        run) break ;;
        stage) [ "$frame_len" -gt 0 ] && head -c "$frame_len" <&3 | tar -x --no-same-owner -f - -C "$base/work" ;;
        prompt) head -c "$frame_len" <&3 > "$base/prompt" ;;
        env|arg|verify|collect)
            value=$(head -c "$frame_len" <&3; echo x); value=${value%x}
            case $frame_kind in
                env)
                    case $frame_name in ''|[0-9]*|*[!A-Za-z0-9_]*) exit 73 ;; esac
                    eval "export $frame_name=\$value" ;;
                arg) argc=$((argc + 1)); eval "arg_$argc=\$value" ;;
                verify) verifyc=$((verifyc + 1)); eval "verify_$verifyc=\$value" ;;
                collect) collectc=$((collectc + 1)); eval "collect_$collectc=\$value" ;;
            esac ;;
        *) exit 74 ;;
    esac
done
[ -f "$base/prompt" ] || : > "$base/prompt"
export PATH="$remote_path" FANOUT_CONTROL="$base/control.json"
if [ "$kind" = bwrap ]; then
    export HOME=/tmp TMPDIR=/tmp
else
    export HOME="$base/home" TMPDIR="$base/home"
fi
cd "$base/work" || exit 75
started=$(date +%s)

# runstep PREFIX COUNT: run the argv held in PREFIX_1..PREFIX_COUNT in a process group of
# its own, watched by the deadline and the lifeline; sets $rc (124: deadline passed).
runstep() {
    prefix=$1 count=$2
    set --
    i=1
    while [ "$i" -le "$count" ]; do eval "set -- \"\$@\" \"\$${prefix}_$i\""; i=$((i + 1)); done
    if [ "$kind" = bwrap ]; then
        net=''
        [ "$network" = 1 ] && net=--share-net
        hide=''
        [ -d "$remote_home/.ssh" ] && hide="$remote_home/.ssh"
        set -- bwrap --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --tmpfs /var/tmp \
            ${hide:+--tmpfs "$hide"} --bind "$base" "$base" --chdir "$base/work" \
            --unshare-all $net --die-with-parent --new-session -- "$@"
    fi
    now=$(date +%s)
    left=$((timeout - (now - started)))
    [ "$left" -lt 1 ] && left=1
    setsid "$@" < "$base/prompt" 2>&1 3<&- 4>&- &
    worker=$!
    # The lifeline: EOF on stdin kills the unit's process group.
    setsid sh -c 'cat > /dev/null; kill -KILL -- "-$1" 2>/dev/null || kill -KILL "$1"' lifeline "$worker" \
        <&3 > /dev/null 2>&1 4>&- &
    lifeline=$!
    # The hard deadline, enforced here even if fanout cannot reach us.
    setsid sh -c 'sleep "$2"; echo 1 > "$3"; kill -KILL -- "-$1" 2>/dev/null || kill -KILL "$1"' deadline \
        "$worker" "$left" "$base/timedout" < /dev/null > /dev/null 2>&1 3<&- 4>&- &
    deadline=$!
    watchers="$lifeline $deadline"
    wait "$worker"
    rc=$?
    kill -KILL -- "-$worker" 2>/dev/null
    kill -KILL -- "-$lifeline" "-$deadline" 2>/dev/null
    worker='' watchers=''
    [ -f "$base/timedout" ] && rc=124
}

runstep arg "$argc"
say "worker $rc"
if [ "$rc" -eq 0 ] && [ "$verifyc" -gt 0 ]; then
    runstep verify "$verifyc"
    say "verify $rc"
fi
[ "$rc" -eq 124 ] && [ -f "$base/timedout" ] && say timeout
if [ -f "$base/control.json" ]; then
    say "control $(wc -c < "$base/control.json")"
    cat "$base/control.json" >&4
fi
if [ "$rc" -eq 0 ] && [ "$collectc" -gt 0 ]; then
    # Regular files only (find does not follow symlinks), matched by fanout's patterns.
    set --
    i=1
    while [ "$i" -le "$collectc" ]; do
        [ "$i" -gt 1 ] && set -- "$@" -o
        eval "set -- \"\$@\" -regex \"\$collect_$i\""
        i=$((i + 1))
    done
    find . -regextype posix-extended -type f \( "$@" \) ! -path ./.fanout-control.json -print0 \
        | tar --null -T - -c -f "$base/collect.tar"
    say "collect $(wc -c < "$base/collect.tar")"
    cat "$base/collect.tar" >&4
fi
say done
