/*
 * pause: the process of a pod's sandbox ("infra") container, built by hack/images.py into the
 * image registry.k8s.io/pause:3.10 (no registry is reachable here, so the node's containerd gets a
 * locally built one under the name its CRI plugin expects).
 *
 * Written for kubeinfer; it does what Kubernetes' build/pause/linux/pause.c does:
 *   - it holds the pod's namespaces open and otherwise sleeps in pause();
 *   - as PID 1 of the pod's PID namespace (shareProcessNamespace) it reaps orphaned children on
 *     SIGCHLD, so they do not stay zombies;
 *   - SIGINT or SIGTERM makes it exit with status 0 (the runtime stops the sandbox that way);
 *   - `pause -v` prints its version and exits.
 * Build: gcc -static -Os -s -o pause pause.c (static: the image holds nothing but this file).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef VERSION
#define VERSION "3.10-kubeinfer"
#endif

static void on_stop(int sig) {
    /* only async-signal-safe calls here */
    static const char msg[] = "pause: shutting down on signal\n";
    (void)sig;
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    _exit(0);
}

static void on_child(int sig) {
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int install(int sig, void (*handler)(int), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "-v") == 0) {
        printf("pause version %s\n", VERSION);
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: %s [-v]\n", argv[0]);
        return 2;
    }
    if (getpid() != 1) {
        fprintf(stderr, "pause: warning: not PID 1; orphans are reaped only in its own PID namespace\n");
    }
    if (install(SIGINT, on_stop, 0) != 0 || install(SIGTERM, on_stop, 0) != 0 ||
        install(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) != 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
    return 42; /* not reached */
}
