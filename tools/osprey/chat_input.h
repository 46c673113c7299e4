/* osprey chat's input side (chat_input.c): user lines, Ctrl-C, history.
 *
 * On a terminal lines come from libedit (emacs key bindings, history, UTF-8 editing); otherwise
 * (pipes, files, tests) as plain lines. Ctrl-C (SIGINT) is caught by a handler that only sets a flag
 * (async-signal-safe): while a reply runs the caller polls chat_sigint_take() between tokens; while a
 * line is read the wait for input ends on it, so chat_input_read() returns CHAT_INPUT_INTERRUPT.
 * Tool code: it may print to stderr. */
#ifndef OSPREY_TOOLS_CHAT_INPUT_H
#define OSPREY_TOOLS_CHAT_INPUT_H

#include <stdbool.h>
#include <stddef.h>

/* Installs the SIGINT handler (SA_RESTART) and unblocks SIGINT in the calling thread, which becomes
 * the one a SIGINT is forwarded to when the kernel hands it to another thread (the engine's workers),
 * so that its wait for input ends. Call once, from the thread that reads the lines. */
void chat_sigint_install(void);
/* True when a SIGINT came since the last call; clears the flag. Async-signal-safe reads only. */
bool chat_sigint_take(void);

typedef struct chat_input chat_input;

typedef enum chat_input_status {
    CHAT_INPUT_LINE = 0,      /* *line holds a line (without its newline) */
    CHAT_INPUT_INTERRUPT = 1, /* Ctrl-C while reading (the flag is taken): what was typed on the
                                 line is dropped (a terminal); a piped partial line is kept for the
                                 next read */
    CHAT_INPUT_EOF = 2,       /* Ctrl-D on an empty line, end of input, or a read error */
} chat_input_status;

/* Opens the input on stdin. tty: use libedit (prompt "> " and editing on stderr, so stdout carries
 * only replies); else plain lines split at '\n' (a last line without one counts), no prompt. history_path (tty only; NULL: none): lines
 * are loaded from it when it exists and each new line is written back to it (mode 0600, libedit's
 * history format), at most 1000 lines. Returns NULL when out of memory or when libedit cannot start
 * (the caller then falls back to tty = false). */
chat_input *chat_input_open(bool tty, const char *history_path);
/* Reads one line. *line (owned by in, valid until the next call) has no trailing '\n' / '\r'.
 * Returns a chat_input_status. */
chat_input_status chat_input_read(chat_input *in, const char **line);
/* Adds a line to the history (tty only; consecutive duplicates and empty lines are skipped) and
 * saves the history file when one is set; a file that cannot be written is reported once on stderr. */
void chat_input_remember(chat_input *in, const char *line);
/* Restores the terminal and frees everything. NULL is fine. */
void chat_input_close(chat_input *in);

#endif
