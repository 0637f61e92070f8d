/* fanout's spawner: one exec that starts a step of sandbox "none" in a PID namespace of
 * its own, where setpriv, unshare and an init shell took three (isolation/spawner.py
 * builds it; isolation/tools.py's _INIT is the shell it stands in for, and says why each
 * check is made).
 *
 *     fanout-spawner LIFELINE -- PROGRAM [ARGUMENT...]
 *
 * 1. It arms its parent-death signal (SIGKILL), then checks that its parent is still
 *    LIFELINE (fanout, or a Ray node's actor): one that died before the signal was armed
 *    would leave the step running beside the run that resumes its unit.  Exit 137.
 * 2. It unshares a PID namespace (as root; anyone else a user namespace first, mapping
 *    their own uid and gid only, as `unshare --map-current-user` does) and forks the
 *    namespace's first process, its init.
 * 3. The init arms its own parent-death signal and checks that its parent is still the
 *    spawner (by the host's /proc: the init's getppid() is 0), then forks the program,
 *    which is not PID 1 (PID 1 ignores the signals it has no handler for and inherits
 *    every orphan).  It reaps what it inherits and, when the program ends, exits with
 *    the program's status (128 + the signal's number for a signal, as a shell says).
 *    The kernel then kills whatever else is left in the namespace before the init's exit
 *    is seen: nothing outlives its unit.  A program that cannot start is exit 127
 *    ("command not found") or 126, with fanout's words on its output.
 * 4. The spawner exits with the init's status.
 *
 * Killing the spawner's process group (fanout's kill) kills the spawner, the init and
 * the program; the init's death, or the spawner's (its parent-death signal), empties the
 * namespace.  It takes no argument but these and reads no environment variable; the
 * program gets the environment and descriptors it was started with.  Built static where
 * the C library allows: no dynamic loader at each step's start.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void say(const char *program, const char *what) {
    dprintf(2, "fanout: cannot start %s: %s\n", program, what);
}

/* The parent of this process as the host's /proc sees it (the init's own getppid() is
 * 0: its parent is outside its namespace), or -1. */
static pid_t host_parent(void) {
    char text[512];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return -1;
    text[n] = '\0';
    char *end = strrchr(text, ')'); /* the command's name may hold spaces and ')' */
    char state;
    int parent;
    if (end == NULL || sscanf(end + 1, " %c %d", &state, &parent) != 2)
        return -1;
    return (pid_t)parent;
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

static int exit_code(int status) {
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 125;
}

static int own_namespace(const char *program) {
    uid_t uid = getuid();
    gid_t gid = getgid();
    int user = geteuid() != 0;
    if (unshare(CLONE_NEWPID | (user ? CLONE_NEWUSER : 0)) != 0) {
        say(program, "no PID namespace here");
        return -1;
    }
    if (user) {
        char map[64];
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
        int failed = write_file("/proc/self/setgroups", "deny\n") != 0
            || write_file("/proc/self/uid_map", map) != 0;
        snprintf(map, sizeof map, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
        if (failed || write_file("/proc/self/gid_map", map) != 0) {
            say(program, "no user namespace here");
            return -1;
        }
    }
    return 0;
}

static void run_program(char **argv) {
    execvp(argv[0], argv);
    if (errno == ENOENT) {
        say(argv[0], "command not found");
        _exit(127);
    }
    say(argv[0], strerror(errno));
    _exit(126);
}

static int init(pid_t spawner, char **argv) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || host_parent() != spawner)
        return 137;
    pid_t program = fork();
    if (program < 0)
        return 125;
    if (program == 0)
        run_program(argv);
    for (;;) {
        int status;
        pid_t reaped = wait(&status);
        if (reaped == program)
            return exit_code(status);
        if (reaped < 0 && errno != EINTR)
            return 125;
    }
}

int main(int argc, char **argv) {
    if (argc < 4 || strcmp(argv[2], "--") != 0) {
        dprintf(2, "usage: fanout-spawner LIFELINE -- PROGRAM [ARGUMENT...]\n");
        return 2;
    }
    char *end;
    long lifeline = strtol(argv[1], &end, 10);
    if (*argv[1] == '\0' || *end != '\0')
        return 2;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != (pid_t)lifeline)
        return 137;
    if (own_namespace(argv[3]) != 0)
        return 125;
    pid_t spawner = getpid();
    pid_t first = fork();
    if (first < 0)
        return 125;
    if (first == 0)
        _exit(init(spawner, argv + 3));
    for (;;) {
        int status;
        pid_t reaped = waitpid(first, &status, 0);
        if (reaped == first)
            return exit_code(status);
        if (reaped < 0 && errno != EINTR)
            return 125;
    }
}
