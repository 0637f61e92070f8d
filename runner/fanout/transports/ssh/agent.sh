# fanout's remote agent (POSIX sh): a small executor of the commands fanout sends it
# (``ssh/wire.py`` has the format).  fanout keeps one SSH channel per slot running
#     exec [unshare FLAGS] sh -c '<this script>' fanout ROOT TOKEN PYTHON KEEPER
# and sends it one sandbox at a time (TOKEN: 64 random bits naming this agent; PYTHON:
# the host's python3, or ''; KEEPER: the source of ``keeper.py``).  It decides nothing about an attempt: every argv
# (bwrap's included), every environment variable, the stdin, which step runs after
# which, until when, and which files are collected come from fanout; the agent makes
# the sandbox directory, moves bytes, runs what it is given and always cleans up.
# Every process started here counts, so builtins are used wherever they can be.
# fanout sends this file without comments.
#
# stdin is the lifeline as well: at EOF (fanout stopped, gave up on a step, or lost the
# connection) whatever still runs in the sandbox is killed, the sandbox is removed and
# the agent exits, while a step runs as well as between commands.
set -u
root=$1 agent=$2 python=$3 keeper=$4
# Clear the environment (sshd's variables, whatever the login shell's rc files
# exported): a step sees exactly the environment fanout sends, nothing of the agent's.
remote_path=${PATH:-/usr/bin:/bin}
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
cd /
# fd 3: commands from fanout; fd 4: answers to fanout; fds 1 and 2: the output stream.
exec 3<&0 4>&1 1>&2 </dev/null
trap '' PIPE
nl='
'
base='' step='' lifeline='' killed='' keeping='' said=''

# The keeper (keeper.py, where the host has python3) makes and removes the sandbox
# directories: a mkdir and an rm process less for each unit.  It talks on two FIFOs
# (fds 5 and 6), which it unlinks before its first answer; they are made in /tmp,
# which bwrap's sandboxes do not see (theirs is private), never in the sandbox root.
# A keeper that does not start leaves the agent to do its work itself, as it does
# without one.
fifo=/tmp/fanout-keeper-$agent
if [ -n "$python" ] && mkfifo -m 600 "$fifo-in" "$fifo-out" 2>/dev/null; then
    "$python" -I -S -c "$keeper" "$root" "$fifo-in" "$fifo-out" < "$fifo-in" > "$fifo-out" \
        2>/dev/null 3<&- 4>&- &
    exec 5> "$fifo-in" 6< "$fifo-out"
    if printf 'hello\n' >&5 2>/dev/null && IFS= read -r said <&6; then
        keeping=1
    else
        exec 5>&- 6<&-
        rm -f "$fifo-in" "$fifo-out"
    fi
fi
unset keeper fifo
# keep VERB TOKEN [DIR...]: true once the keeper did it; false: the agent's turn.
keep() {
    [ -n "$keeping" ] || return 1
    said=''
    printf '%s\n' "$*" >&5 2>/dev/null && IFS= read -r said <&6
    [ "$said" = ok ] && return
    # Gone (killed, or out of memory): the agent does the rest of its work itself.
    [ -n "$said" ] || { keeping=''; exec 5>&- 6<&-; }
    return 1
}

# sweep: SIGKILL what works in the sandbox or carries its FANOUT_CONTROL (the local
# rule, local._kill_escapees), among the processes this login may signal: a worker's
# setsid'd process where the host has no PID namespace, or bwrap's sandbox process
# when bwrap was killed before it had armed --die-with-parent.  Compared as strings:
# a sandbox root is never a pattern here.
sweep() {
    find /proc -mindepth 2 -maxdepth 2 -name cwd -printf '%h %l\n' 2>/dev/null \
        | while IFS=' ' read -r proc dir; do
            case $dir in "$base"|"$base"/*) kill -s KILL "${proc#/proc/}" 2>/dev/null ;; esac
        done
    for proc in $(grep -lszF "FANOUT_CONTROL=$base/" /proc/[0-9]*/environ); do
        proc=${proc#/proc/}
        kill -s KILL "${proc%/environ}" 2>/dev/null
    done
}
# settle: until no process of the sandbox (one carrying its FANOUT_CONTROL) still runs,
# at most 2 s.  What the kernel killed with the sandbox's PID namespace, or the sweep
# killed, dies when it is next scheduled: on a loaded host that is after bwrap has
# returned (it exits on its init's word, not when the kernel has emptied the
# namespace), and "closed" means nothing of the attempt is left.  A
# zombie's environ reads empty: it runs nothing, and does not count.  It costs a grep
# over every process's environ (2.5 ms here, most of a no-op unit's host CPU), so
# fanout asks for it only where something may linger ("close"), and the agent adds
# the steps that did not end by themselves.
settle() {
    tries=0
    while [ "$tries" -lt 200 ] && grep -qszF "FANOUT_CONTROL=$base/" /proc/[0-9]*/environ; do
        sleep 0.01
        tries=$((tries + 1))
    done
}
# remove: the sandbox removed as removal.py removes a local one (this host may have no
# Python): rm -rf, and where that left something, the worker's folders given back
# their owner's permissions (chmod 000) and, as root, immutable and append-only flags
# cleared (chattr +i, +a), then rm -rf again.  What still stands is renamed
# fanout-unremovable-TOKEN, for whoever looks ("left" then names it).
remove() {
    left=''
    cd /
    keep rm "${base##*/fanout-}" && return
    rm -rf "$base" 2>/dev/null && return
    [ -L "$base" ] && return  # the worker's, not the sandbox: chmod would follow it
    chmod -R u+rwx "$base" 2>/dev/null
    [ "$(id -u)" = 0 ] && chattr -R -i -a "$base" 2>/dev/null
    rm -rf "$base" 2>/dev/null && return
    left=fanout-unremovable-${base##*/fanout-}
    mv "$base" "$root/$left" 2>/dev/null || left=${base##*/}
}
teardown() {
    [ -n "$step" ] && kill -s KILL -- "-$step" "$step" 2>/dev/null
    if [ -n "$base" ]; then
        sweep
        remove
    fi
    [ -n "$lifeline" ] && kill -s KILL "$lifeline" 2>/dev/null
}
trap teardown EXIT
trap 'exit 143' HUP INT TERM
say() { printf '%s\n' "$*" >&4; }

# start_step, in a step's subshell: exactly the environment and argv fanout sent
# ("$rest"), the step's own program checked (builtins: a missing one is exit 127 with
# fanout's words, as on every transport), then the argv behind the host's backstop.
start_step() {
    unset PATH
    eval "$rest"
    command -v "$program" > /dev/null || {
        printf 'fanout: cannot start %s: command not found\n' "$program" >&2
        exit 127
    }
    unset program
    exec timeout -k 2 "$backstop" "$@" 3<&- 4>&- 5>&- 6<&-
}

# hand LIMIT NAME: the sandbox's regular file NAME, never through a symlink (the steps
# that could swap one in are gone), as "data LENGTH" and at most LIMIT bytes; or false
# when there is none (the caller says "none").
hand() {
    case $2 in ''|*/*|.|..) exit 72 ;; esac
    [ -f "$base/$2" ] && [ ! -L "$base/$2" ] || return 1
    head -c "$1" "$base/$2" > "$base/.answer" 2>/dev/null
    say "data $(wc -c < "$base/.answer")"
    cat "$base/.answer" >&4
}

# finish HOW: the sandbox's end (close's HOW), and its answer in $answer.
finish() {
    case $1 in
    sweep) sweep; settle ;;
    settle) settle ;;
    ended) [ -z "$killed" ] || settle ;;
    *) exit 72 ;;
    esac
    remove
    base=''
    answer=closed
    [ -z "$left" ] || answer="closed left $left"
}

while IFS=' ' read -r verb rest <&3; do
    case $verb in
    open)
        token=${rest%% *}
        case $token in ''|*[!0-9a-f]*) exit 72 ;; esac
        [ -z "$base" ] || exit 72
        killed=''
        # TOKEN is 64 random bits from fanout: nobody can have made this path before.
        base=$root/fanout-$token
        eval "${rest#* }"  # set -- DIR...
        for dir in "$@"; do
            case $dir in ''|.|..|*[!A-Za-z0-9._-]*) exit 72 ;; esac
        done
        keep mk "$token" "$@" && continue
        for dir in "$@"; do set -- "$@" "$base/$dir"; shift; done
        if ! mkdir -m 700 "$base" "$@" 2>/dev/null; then
            base=''
            say "error cannot create a sandbox in $root (sandboxRoot must be a writable directory)"
            exit 70
        fi
        ;;
    put)
        case $rest in ''|*[!0-9]*) exit 72 ;; esac
        [ -n "$base" ] || exit 72
        head -c "$rest" <&3 | tar -x -p -m --no-same-owner -f - -C "$base/work" || exit 76
        ;;
    run)
        backstop=${rest%% *} rest=${rest#* }
        mark=${rest%% *} rest=${rest#* }
        length=${rest%% *} rest=${rest#* }
        limit=${rest%% *} rest=${rest#* }
        then=${rest%% *} rest=${rest#* }
        ending=${rest%% *} rest=${rest#* }
        case $backstop$length$limit in ''|*[!0-9]*) exit 72 ;; esac
        case $mark in ''|*[!0-9a-f]*) exit 72 ;; esac
        [ -n "$base" ] || exit 72
        # The stdin, read whole before the lifeline reads fd 3, into shell memory (never
        # disk), ends in a '.' from fanout that $(...) cannot take away with the newlines.
        stdin=''
        if [ "$length" -gt 0 ]; then
            stdin=$(head -c "$((length + 1))" <&3) || exit 76
            stdin=${stdin%.}
        fi
        # The step: exactly the environment it is given, its stdin on a pipe (as a local
        # step has it; none at all: /dev/null, one process less), its argv, behind a
        # deadline of its own for when fanout can no longer reach this host (fanout's
        # own deadline is earlier and the one that counts).  timeout makes it a process
        # group of its own, which teardown kills whole.
        if [ "$length" -gt 0 ]; then
            printf '%s' "$stdin" 2>/dev/null 3<&- 4>&- | (trap - PIPE; start_step) &
        else
            (trap - PIPE; start_step) < /dev/null &
        fi
        step=$!
        unset rest stdin
        # The lifeline: EOF on stdin while the step runs TERMs this shell (its trap
        # tears down).  Nothing else arrives on stdin until the step's answer.
        (trap - PIPE; while IFS= read -r _; do :; done; kill -s TERM $$) <&3 > /dev/null 2>&1 4>&- 5>&- 6<&- &
        lifeline=$!
        wait "$step"
        rc=$?
        # 124 and up: a step timeout or a signal ended, or that never started: what
        # it left may not be gone yet.
        [ "$rc" -ge 124 ] && killed=1
        kill -s KILL -- "-$step" 2>/dev/null  # what the step left running in its group
        step=''
        kill -s KILL "$lifeline" 2>/dev/null
        wait "$lifeline" 2>/dev/null
        lifeline=''
        # The end of this step's output; MARK is never shown to the step.
        printf '\n\036fanout-end %s\n' "$mark"
        # A file fanout reads after a step (its control file), and for the attempt's
        # last step (ENDING is not "-") the sandbox's end, sent along: two round trips
        # less, and where there is no control file, one write (one packet) for all.
        told="ran $rc"
        if [ "$limit" -gt 0 ]; then
            case $then in ''|*/*|.|..) exit 72 ;; esac
            if [ -f "$base/$then" ] && [ ! -L "$base/$then" ]; then
                say "$told"
                told=''
                hand "$limit" "$then"
            else
                told="$told${nl}none"
            fi
        fi
        if [ "$ending" != - ]; then
            finish "$ending"
            told="${told:+$told$nl}$answer"
        fi
        [ -z "$told" ] || say "$told"
        ;;
    cat)
        limit=${rest%% *}
        case $limit in ''|*[!0-9]*) exit 72 ;; esac
        [ -n "$base" ] || exit 72
        eval "${rest#* }"  # set -- NAME
        hand "$limit" "$1" || say none
        ;;
    list)
        [ -n "$base" ] || exit 72
        eval "$rest"  # set -- ROOT...
        # -P: a symlink, the roots included, is listed as one and never followed.
        cd "$base/work" && find -P "$@" -printf '%y%p\0' >&4 2>/dev/null
        cd /
        printf '\0' >&4
        ;;
    get)
        [ -n "$base" ] || exit 72
        eval "$rest"  # set -- NAME...
        cd "$base/work" && tar -c -f "$base/.answer" --no-recursion --hard-dereference \
            -- "$@" 2>/dev/null
        cd /
        say "data $(wc -c < "$base/.answer" 2>/dev/null || echo 0)"
        cat "$base/.answer" >&4 2>/dev/null
        ;;
    close)
        [ -n "$base" ] || exit 72
        finish "$rest"
        say "$answer"
        ;;
    *)
        exit 72
        ;;
    esac
done
