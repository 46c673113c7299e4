/* osprey chat's input: lines from libedit on a terminal, plain lines otherwise, and Ctrl-C.
 *
 * The SIGINT handler only sets a flag; when the kernel hands the signal to another thread (the
 * engine's workers) it also forwards it to the reading thread. While a reply runs the reply loop
 * polls the flag between tokens. While a line is read, SIGINT is blocked in the reading thread
 * except inside pselect(), which waits for input with SIGINT unblocked atomically: a Ctrl-C that
 * comes while a key is being handled stays pending until the next wait and ends it at once, so none
 * is lost between a flag check and a blocking read. Both readers go through that wait: libedit gets
 * its characters from read_char() below (EL_GETCFN; libedit's own signal handling, EL_SIGNAL, stays
 * off: it re-sends a signal to the whole process group), and plain input is split into lines from
 * a buffer of our own (a partial line read before a Ctrl-C stays there for the next read).
 *
 * History (a terminal only): libedit's history, written back whole after each line through a file
 * opened with mode 0600 (the lines are the user's conversation). */
#include <errno.h>
#include <fcntl.h>
#include <histedit.h>
#include <langinfo.h>
#include <limits.h>
#include <locale.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>
#include <wchar.h>

#include "chat_input.h"

#define CHAT_HISTORY_SIZE 1000

/* ---- SIGINT ----------------------------------------------------------------------------------- */

static volatile sig_atomic_t g_sigint;
static pthread_t g_reader;

static void on_sigint(int sig) {
    (void)sig;
    g_sigint = 1;
    /* pthread_self and pthread_kill are async-signal-safe (POSIX.1-2008) */
    if (!pthread_equal(pthread_self(), g_reader)) pthread_kill(g_reader, SIGINT);
}

void chat_sigint_install(void) {
    g_reader = pthread_self();
    g_sigint = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* a write to the terminal is never cut short by Ctrl-C */
    sigaction(SIGINT, &sa, NULL);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
}

bool chat_sigint_take(void) {
    if (!g_sigint) return false;
    g_sigint = 0;
    return true;
}

/* Waits until fd is readable, with SIGINT blocked by the caller and unblocked only inside
 * pselect(). Returns 0 (readable, or an error that read() will report), -1 on Ctrl-C. */
static int wait_input(int fd) {
    sigset_t during;
    pthread_sigmask(SIG_SETMASK, NULL, &during);
    sigdelset(&during, SIGINT);
    for (;;) {
        if (g_sigint) return -1;
        fd_set rd;
        FD_ZERO(&rd);
        FD_SET(fd, &rd);
        const int r = pselect(fd + 1, &rd, NULL, NULL, NULL, &during);
        if (r > 0 || (r < 0 && errno != EINTR)) return 0;
        /* EINTR: ours (the flag is set) or another signal's (SIGWINCH, SIGCONT): look again */
    }
}

/* ---- input ------------------------------------------------------------------------------------ */

struct chat_input {
    EditLine *el;        /* NULL: plain lines */
    History *hist;
    char *history_path;
    bool history_failed; /* reported once */
    bool interrupted;    /* read_char saw a Ctrl-C */
    char *line;          /* the line handed out */
    size_t line_cap;
    char *in;            /* plain input: bytes read and not yet handed out [in_len] */
    size_t in_len, in_cap;
    bool eof;
};

static char *prompt(EditLine *el) {
    (void)el;
    return "> ";
}

/* libedit's character source (EL_GETCFN): one character from stdin, decoded in the locale's
 * encoding. 1: a character in *wc; 0: end of input; -1: Ctrl-C (in->interrupted) or a read error. */
static int read_char(EditLine *el, wchar_t *wc) {
    chat_input *in = NULL;
    el_get(el, EL_CLIENTDATA, &in);
    char b[MB_LEN_MAX];
    size_t n = 0;
    for (;;) {
        if (wait_input(STDIN_FILENO) < 0) {
            in->interrupted = true;
            errno = EINTR;
            return -1;
        }
        const ssize_t r = read(STDIN_FILENO, b + n, 1);
        if (r == 0) return 0;
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return -1;
        }
        n++;
        mbstate_t st;
        memset(&st, 0, sizeof st);
        const size_t k = mbrtowc(wc, b, n, &st);
        if (k == (size_t)-2 && n < sizeof b) continue; /* more bytes of this character to come */
        if (k == (size_t)-1 || k == (size_t)-2) {       /* not in the encoding: dropped */
            n = 0;
            continue;
        }
        if (k == 0) *wc = 0;
        return 1;
    }
}

/* libedit decodes keys with the C library's multibyte functions: UTF-8 needs a UTF-8 LC_CTYPE. The
 * environment's when it is UTF-8, else C.UTF-8 (glibc has it built in); only LC_CTYPE changes
 * (number formats stay "C"). */
static void utf8_ctype(void) {
    if (setlocale(LC_CTYPE, "") && !strcmp(nl_langinfo(CODESET), "UTF-8")) return;
    if (!setlocale(LC_CTYPE, "C.UTF-8")) setlocale(LC_CTYPE, "C");
}

chat_input *chat_input_open(bool tty, const char *history_path) {
    chat_input *in = calloc(1, sizeof *in);
    if (!in) return NULL;
    if (!tty) return in;
    utf8_ctype();
    in->el = el_init("osprey", stdin, stderr, stderr);
    if (!in->el) {
        free(in);
        return NULL;
    }
    el_set(in->el, EL_EDITOR, "emacs");
    el_set(in->el, EL_PROMPT, prompt);
    el_set(in->el, EL_SIGNAL, 0);
    el_set(in->el, EL_CLIENTDATA, in);
    el_set(in->el, EL_GETCFN, read_char);
    el_source(in->el, NULL); /* ~/.editrc, as every libedit program reads it */
    HistEvent ev;
    if (!(in->hist = history_init())) {
        chat_input_close(in);
        return NULL;
    }
    history(in->hist, &ev, H_SETSIZE, CHAT_HISTORY_SIZE);
    history(in->hist, &ev, H_SETUNIQUE, 1);
    el_set(in->el, EL_HIST, history, in->hist);
    if (history_path) {
        if (!(in->history_path = strdup(history_path))) {
            chat_input_close(in);
            return NULL;
        }
        if (access(history_path, F_OK) == 0 && history(in->hist, &ev, H_LOAD, history_path) < 0)
            fprintf(stderr, "osprey: warning: cannot read the history file %s\n", history_path);
    }
    return in;
}

/* Copies s[n] into in->line, without trailing '\n' / '\r'. */
static int hand_out(chat_input *in, const char *s, size_t n) {
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    if (n + 1 > in->line_cap) {
        char *p = realloc(in->line, n + 1);
        if (!p) return -1;
        in->line = p, in->line_cap = n + 1;
    }
    memcpy(in->line, s, n);
    in->line[n] = 0;
    return 0;
}

static chat_input_status read_edit(chat_input *in) {
    int n = 0;
    in->interrupted = false;
    const char *s = el_gets(in->el, &n);
    if (in->interrupted) {
        fputc('\n', stderr); /* the prompt's line ends where the user pressed Ctrl-C */
        return CHAT_INPUT_INTERRUPT;
    }
    if (!s || n <= 0) {
        fputc('\n', stderr); /* the shell's prompt after quitting starts on a line of its own */
        return CHAT_INPUT_EOF;
    }
    return hand_out(in, s, (size_t)n) ? CHAT_INPUT_EOF : CHAT_INPUT_LINE;
}

static chat_input_status read_plain(chat_input *in) {
    for (;;) {
        char *nl = in->in_len ? memchr(in->in, '\n', in->in_len) : NULL;
        if (nl || (in->eof && in->in_len)) { /* a whole line, or the last one without its newline */
            const size_t n = nl ? (size_t)(nl - in->in) + 1 : in->in_len;
            if (hand_out(in, in->in, n)) return CHAT_INPUT_EOF;
            memmove(in->in, in->in + n, in->in_len - n);
            in->in_len -= n;
            return CHAT_INPUT_LINE;
        }
        if (in->eof) return CHAT_INPUT_EOF;
        if (in->in_len + 4096 > in->in_cap) {
            const size_t cap = in->in_cap ? in->in_cap * 2 : 8192;
            char *p = realloc(in->in, cap);
            if (!p) return CHAT_INPUT_EOF;
            in->in = p, in->in_cap = cap;
        }
        if (wait_input(STDIN_FILENO) < 0) return CHAT_INPUT_INTERRUPT;
        const ssize_t r = read(STDIN_FILENO, in->in + in->in_len, in->in_cap - in->in_len);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r <= 0) in->eof = true; /* end of input, or an error that ends it */
        else in->in_len += (size_t)r;
    }
}

chat_input_status chat_input_read(chat_input *in, const char **line) {
    *line = NULL;
    sigset_t s, old;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    pthread_sigmask(SIG_BLOCK, &s, &old); /* SIGINT only inside wait_input's pselect */
    const chat_input_status st = in->el ? read_edit(in) : read_plain(in);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (st == CHAT_INPUT_INTERRUPT) chat_sigint_take(); /* this read took it */
    if (st == CHAT_INPUT_LINE) *line = in->line;
    return st;
}

void chat_input_remember(chat_input *in, const char *line) {
    if (!in->hist || !line[0]) return;
    HistEvent ev;
    if (history(in->hist, &ev, H_ENTER, line) < 0 || !in->history_path) return;
    /* written whole each time (at most CHAT_HISTORY_SIZE lines): a session killed later keeps it */
    const int fd = open(in->history_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    bool ok = f && history(in->hist, &ev, H_SAVE_FP, f) >= 0;
    if (f) ok = fclose(f) == 0 && ok;
    else if (fd >= 0) close(fd);
    if (!ok && !in->history_failed) {
        fprintf(stderr, "osprey: warning: cannot write the history file %s (--no-history turns it off)\n",
                in->history_path);
        in->history_failed = true;
    }
}

void chat_input_close(chat_input *in) {
    if (!in) return;
    if (in->el) el_end(in->el); /* restores the terminal */
    if (in->hist) history_end(in->hist);
    free(in->history_path);
    free(in->line);
    free(in->in);
    free(in);
}
