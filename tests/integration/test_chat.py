"""`osprey chat` driven as a user drives it: through a pseudo-terminal (libedit's line editing, Ctrl-C
as the terminal sends it, the history file) and through plain pipes. SmolLM2 (models/) greedy; skipped
when the model is absent. Replies use --ignore-eos -n N so that their length is known: a Ctrl-C sent as
soon as the first reply bytes show lands while the reply still has most of its tokens to go.

Run once per suite: chat has no engine process, so the process-mode twin of the suite skips it."""
import json
import os
import pty
import select
import signal
import subprocess
import tempfile
import termios
import time

import pytest

from conftest import BIN, ENGINE_PROCESS, SMOL

pytestmark = [
    pytest.mark.skipif(not os.path.exists(SMOL), reason=f"no SmolLM2 model at {SMOL} (make fetch)"),
    pytest.mark.skipif(ENGINE_PROCESS, reason="osprey chat has no engine process: run once, in the thread-mode suite"),
]

HANG = 600  # seconds before a wait gives up: a hang guard, not a timing assertion
STATS_END = b"]\r\n"


class Term:
    """osprey chat on a pseudo-terminal. The terminal gets NOFLSH so that a Ctrl-C does not discard
    reply bytes not yet read here (the kernel flushes a terminal's queues on an interrupt otherwise):
    what the test reads is then exactly what chat wrote."""

    def __init__(self, home, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: chat on the terminal's slave side
            try:
                attrs = termios.tcgetattr(0)
                attrs[3] |= termios.NOFLSH
                termios.tcsetattr(0, termios.TCSANOW, attrs)
                env = dict(os.environ, HOME=home, TERM="xterm")
                os.execve(BIN, [BIN, "chat", "-m", SMOL, "-t", "2", "--temp", "0", *args], env)
            finally:
                os._exit(127)
        self.buf = b""
        self.status = None

    def _fill(self, deadline):
        r, _, _ = select.select([self.fd], [], [], max(0.0, min(1.0, deadline - time.time())))
        if r:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                data = b""
            if not data:
                raise AssertionError(f"chat closed the terminal; last output: {self.buf[-2000:]!r}")
            self.buf += data

    def expect(self, pat):
        """Reads until pat; returns everything before it and drops both from the buffer."""
        deadline = time.time() + HANG
        while pat not in self.buf:
            if time.time() > deadline:
                raise AssertionError(f"no {pat!r} in: {self.buf[-2000:]!r}")
            self._fill(deadline)
        before, _, self.buf = self.buf.partition(pat)
        return before

    def some(self):
        """Reads until at least one byte is buffered; returns and drops the buffer."""
        deadline = time.time() + HANG
        while not self.buf:
            if time.time() > deadline:
                raise AssertionError("no output")
            self._fill(deadline)
        out, self.buf = self.buf, b""
        return out

    def editing(self):
        """Waits until libedit has the terminal (no canonical mode, no echo): keys typed from now on are
        read by the line editor and echoed by it, once."""
        deadline = time.time() + HANG
        while termios.tcgetattr(self.fd)[3] & (termios.ICANON | termios.ECHO):
            if time.time() > deadline:
                raise AssertionError("libedit never took the terminal")
            time.sleep(0.01)

    def type(self, keys):
        self.editing()
        os.write(self.fd, keys)

    def line(self, text):
        """Types a line and Enter; returns after libedit's echo of it."""
        self.expect(b"> ")
        self.type(text.encode() + b"\r")
        self.expect(text.encode() + b"\r\n")

    def wait(self):
        deadline = time.time() + HANG
        while self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
                break
            if time.time() > deadline:
                raise AssertionError("chat did not exit")
            try:  # keep draining so chat never blocks on a full terminal
                self._fill(time.time() + 0.05)
            except AssertionError:
                time.sleep(0.01)
        os.close(self.fd)
        return self.status

    def kill(self):
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass


def shown(raw):
    """Terminal bytes of a reply as the text chat wrote: the terminal's \\r\\n back to \\n, and the ^C
    the terminal echoes where Ctrl-C was pressed taken out."""
    return raw.replace(b"^C", b"").replace(b"\r\n", b"\n").decode()


@pytest.fixture
def home():
    with tempfile.TemporaryDirectory(prefix="osprey-chat-") as d:
        yield d


def test_ctrl_c_stops_the_reply_not_the_session(home):
    """Ctrl-C mid-reply: the request is aborted, the engine reports its KV blocks free, the text shown
    stays in the conversation as the assistant's message; the next line is answered (its prompt holds
    the partial reply); /save shows the conversation; at the prompt one Ctrl-C warns, the second quits 0."""
    t = Term(home, "--ignore-eos", "-n", "64")
    try:
        t.line("Tell me a story.")
        first = t.some()  # the reply has begun: Ctrl-C now
        os.write(t.fd, b"\x03")
        rest = t.expect(b"\r\n[prompt ")
        stats1 = t.expect(STATS_END).decode()
        assert "interrupted: the text shown is kept, the KV blocks are freed" in stats1, stats1
        n_shown = int(stats1.split("| reply ")[1].split()[0])
        assert 0 < n_shown < 64, stats1  # stopped early: not the -n 64 a whole reply has
        partial = shown(first + rest)
        assert partial.strip(), "no reply text before the Ctrl-C"

        t.line("What is 2+2?")
        second = t.expect(b"\r\n[prompt ")
        p2, _, stats2 = t.expect(STATS_END).decode().partition(" tokens")
        assert "interrupted" not in stats2 and "max tokens" in stats2, stats2  # the whole reply, to -n 64
        reply2 = shown(second)

        path = os.path.join(home, "conv.json")
        t.line("/save " + path)
        t.expect(b"[saved 4 messages to " + path.encode() + b"]")
        with open(path, encoding="utf-8") as f:
            conv = json.load(f)
        assert conv == [{"role": "user", "content": "Tell me a story."},
                        {"role": "assistant", "content": partial},
                        {"role": "user", "content": "What is 2+2?"},
                        {"role": "assistant", "content": reply2}]

        t.expect(b"> ")
        t.type(b"\x03")
        t.expect(b"[Ctrl-C again, Ctrl-D or /exit quits]")
        t.type(b"\x03")
        assert t.wait() == 0
    finally:
        t.kill()


def test_save_load_round_trip_on_the_terminal(home):
    """A conversation saved in one session and loaded in another continues as the same conversation:
    the reply after /load equals the reply the first session gives to the same line."""
    path = os.path.join(home, "conv.json")
    t = Term(home, "--ignore-eos", "-n", "8")
    try:
        t.line("Hello")
        t.expect(STATS_END)
        t.line("/save " + path)
        t.expect(b"[saved 2 messages")
        t.line("Name a color.")
        want = shown(t.expect(b"\r\n[prompt "))
        t.expect(STATS_END)
        t.expect(b"> ")
        t.type(b"\x04")  # Ctrl-D on an empty line
        assert t.wait() == 0
    finally:
        t.kill()
    t = Term(home, "--ignore-eos", "-n", "8")
    try:
        t.line("/load " + path)
        t.expect(b"[loaded 2 messages from " + path.encode())
        t.line("Name a color.")
        assert shown(t.expect(b"\r\n[prompt ")) == want
        t.line("/exit")
        assert t.wait() == 0
    finally:
        t.kill()


def test_bad_load_file_keeps_the_session(home):
    """Files /load refuses, each with a clear error and the conversation unchanged: malformed JSON, a
    bad role, not a conversation, a directory, a missing file. /save of the session afterwards still
    holds only its own messages."""
    files = {"broken.json": '[{"role": "user", "content": ',
             "role.json": '[{"role": "wizard", "content": "hi"}]',
             "shape.json": '{"model": "x"}'}
    for name, text in files.items():
        with open(os.path.join(home, name), "w") as f:
            f.write(text)
    t = Term(home, "-n", "4", "--ignore-eos")
    try:
        t.line("Hello")
        t.expect(STATS_END)
        errors = [("broken.json", "not JSON"), ("role.json", "messages[0].role 'wizard'"),
                  ("shape.json", "a JSON array of messages"), (".", "not a regular file"),
                  ("missing.json", "No such file or directory")]
        for name, why in errors:
            t.line("/load " + os.path.join(home, name))
            err = t.expect(b"\r\n").decode()
            assert err.startswith("osprey: error: /load ") and why in err, err
        path = os.path.join(home, "after.json")
        t.line("/save " + path)
        t.expect(b"[saved 2 messages")
        with open(path, encoding="utf-8") as f:
            assert [m["role"] for m in json.load(f)] == ["user", "assistant"]
        t.line("/exit")
        assert t.wait() == 0
    finally:
        t.kill()


def test_line_editing_and_history(home):
    """libedit edits the line (a typo fixed with Backspace reaches the model fixed), the history file is
    written with mode 0600, and a new session recalls its last line with Ctrl-P; --no-history writes
    none."""
    t = Term(home, "-n", "2", "--ignore-eos")
    try:
        t.expect(b"> ")
        t.type(b"Hellx\x7fo\r")  # \x7f: the terminal's erase key
        t.expect(STATS_END)
        t.expect(b"> ")
        t.type(b"\x04")
        assert t.wait() == 0
    finally:
        t.kill()
    hist = os.path.join(home, ".osprey_history")
    assert os.stat(hist).st_mode & 0o777 == 0o600
    with open(hist, encoding="utf-8", errors="replace") as f:
        assert "Hello" in f.read().split("\n")
    path = os.path.join(home, "conv.json")
    t = Term(home, "-n", "2", "--ignore-eos")
    try:
        t.expect(b"> ")
        t.type(b"\x10\r")  # Ctrl-P: the previous line of the history
        t.expect(STATS_END)
        t.line("/save " + path)
        t.expect(b"[saved 2 messages")
        with open(path, encoding="utf-8") as f:
            assert json.load(f)[0] == {"role": "user", "content": "Hello"}
        t.line("/exit")
        assert t.wait() == 0
    finally:
        t.kill()
    with tempfile.TemporaryDirectory(prefix="osprey-chat-") as other:
        t = Term(other, "-n", "2", "--no-history")
        try:
            t.line("Hi")
            t.expect(STATS_END)
            t.line("/exit")
            assert t.wait() == 0
        finally:
            t.kill()
        assert not os.path.exists(os.path.join(other, ".osprey_history"))


def test_ctrl_c_through_pipes(home):
    """Without a terminal (stdin and stdout pipes) SIGINT mid-reply stops that reply the same way, the
    next piped line is answered, and a SIGINT while waiting for input followed by a second one quits 0;
    a save through the pipe then loads in a later piped session."""
    p = subprocess.Popen([BIN, "chat", "-m", SMOL, "-t", "2", "--temp", "0", "--ignore-eos", "-n", "64"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.stdin.write(b"Tell me a story.\n")
        p.stdin.flush()
        first = os.read(p.stdout.fileno(), 1)  # the reply has begun
        assert first
        p.send_signal(signal.SIGINT)
        path = os.path.join(home, "piped.json")
        p.stdin.write(f"What is 2+2?\n/save {path}\n".encode())
        p.stdin.flush()
        err = b""
        while b"[saved 4 messages" not in err:  # stderr: stats lines, then the save
            chunk = os.read(p.stderr.fileno(), 4096)
            assert chunk, err
            err += chunk
        assert b"interrupted: the text shown is kept, the KV blocks are freed" in err
        p.send_signal(signal.SIGINT)  # waiting for input: warns
        while b"[Ctrl-C again" not in err:
            chunk = os.read(p.stderr.fileno(), 4096)
            assert chunk, err
            err += chunk
        p.send_signal(signal.SIGINT)  # the second one quits
        assert p.wait(timeout=HANG) == 0
        with open(path, encoding="utf-8") as f:
            conv = json.load(f)
        assert [m["role"] for m in conv] == ["user", "assistant", "user", "assistant"]
        assert conv[1]["content"] and conv[3]["content"]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    q = subprocess.run([BIN, "chat", "-m", SMOL, "-t", "2", "--temp", "0", "-n", "4"],
                       input=f"/load {path}\n".encode(), capture_output=True, timeout=HANG)
    assert q.returncode == 0 and b"[loaded 4 messages" in q.stderr, q.stderr
