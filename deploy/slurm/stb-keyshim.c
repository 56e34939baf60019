/*
 * stb-keyshim: gives tritonserver its model-control key without the key ever being on a
 * command line or in an environment.
 *
 * Triton takes the key of its restricted model-repository API only as an argument
 * (--http-restricted-api=model-repository:X-Stb-Key=<key>), and any user of a node reads
 * every process's arguments in /proc/<pid>/cmdline. So triton-server.sbatch passes the
 * placeholder @STB_KEY@ instead, and runs tritonserver with this library in LD_PRELOAD.
 * Before tritonserver's main() runs, this constructor reads the key from the file named
 * by STB_TRITON_KEY_FILE (which must be readable by its owner only) and points the
 * argument at a copy in the heap with the key in place of the placeholder. main() parses
 * the real key; /proc/<pid>/cmdline still shows the original argument area, which holds
 * the placeholder. The key is never in the environment (only the file's path is), and
 * LD_PRELOAD is dropped for tritonserver's own children (backend stubs).
 *
 * It fails closed: a placeholder with no readable, private, well-formed key file stops
 * the process before main() with exit status 2 and the reason on stderr.
 *
 * glibc passes (argc, argv, envp) to ELF constructors; argv is the array main() gets.
 * Build: cc -shared -fPIC -O2 -o libstbkey.so stb-keyshim.c (the bridge does this for
 * the lab, bridge/daemon/keyshim.py). In a container it is loaded by the image's glibc:
 * statx (glibc 2.28) rather than fstat (a new symbol in 2.33) keeps the newest symbol it
 * needs at GLIBC_2.28, whatever glibc it was built with.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PLACEHOLDER "@STB_KEY@"
#define MAX_KEY 256

static void die(const char *why) {
    fprintf(stderr, "stb-keyshim: %s\n", why);
    _exit(2);
}

static int key_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_' || c == '.' || c == '~';
}

/* argv[i] with every placeholder replaced by key, in a new heap string */
static char *substitute(const char *arg, const char *key) {
    size_t plen = strlen(PLACEHOLDER), klen = strlen(key), n = 0;
    for (const char *p = strstr(arg, PLACEHOLDER); p; p = strstr(p + plen, PLACEHOLDER)) n++;
    char *out = malloc(strlen(arg) + n * klen + 1);
    if (!out) die("out of memory");
    char *w = out;
    for (const char *r = arg;;) {
        const char *p = strstr(r, PLACEHOLDER);
        size_t keep = p ? (size_t)(p - r) : strlen(r);
        memcpy(w, r, keep);
        w += keep;
        if (!p) break;
        memcpy(w, key, klen);
        w += klen;
        r = p + plen;
    }
    *w = '\0';
    return out;
}

__attribute__((constructor)) static void stb_keyshim(int argc, char **argv, char **envp) {
    (void)envp;
    unsetenv("LD_PRELOAD");
    int uses = 0;
    for (int i = 0; i < argc; i++)
        if (strstr(argv[i], PLACEHOLDER)) uses++;
    if (uses == 0) return;

    const char *path = getenv("STB_TRITON_KEY_FILE");
    if (!path || !*path) die("STB_TRITON_KEY_FILE is not set");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) die("cannot open the key file named by STB_TRITON_KEY_FILE");
    struct statx st;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_MODE, &st) != 0 || !S_ISREG(st.stx_mode))
        die("the key file is not a regular file");
    if (st.stx_mode & (S_IRWXG | S_IRWXO))
        die("the key file is readable by group or others: chmod 600 it");
    char key[MAX_KEY + 2];
    ssize_t n = read(fd, key, MAX_KEY + 1);
    close(fd);
    if (n <= 0) die("the key file is empty");
    while (n > 0 && (key[n - 1] == '\n' || key[n - 1] == '\r' || key[n - 1] == ' ')) n--;
    if (n == 0) die("the key file is empty");
    if (n > MAX_KEY) die("the key is longer than 256 characters");
    key[n] = '\0';
    for (ssize_t i = 0; i < n; i++)
        if (!key_char(key[i])) die("the key may hold only letters, digits and -_.~");

    for (int i = 0; i < argc; i++)
        if (strstr(argv[i], PLACEHOLDER)) argv[i] = substitute(argv[i], key);
    explicit_bzero(key, sizeof key);
}
