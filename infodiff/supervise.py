"""One line, not a C++ abort, when a process of a multi-process run dies or never joins.

JAX's distributed client (jaxlib 0.10.2) ends a process with a C++ check failure (SIGABRT: the
check-failure stack, Python's fault handler dump, 30-65 lines) whenever its coordination service
reports an error: a peer that stopped sending heartbeats, a coordinator that went away (at once:
its error poll fails), a join that timed out ("another task died" even when it never started).
The callback that aborts (``missed_heartbeat_callback``) cannot be replaced from Python: a
Python callable there fails with ``std::bad_cast`` and aborts all the same, and
``jax_enable_recoverability`` only lets the survivors run on into collectives that never
finish. So when ``train.py`` / ``evaluate.py`` run as one of several processes, the process
you start is a small **supervisor** (standard library only: it imports JAX only to read a
SLURM / Open MPI / TPU job's settings with JAX's own detection, and starts no backend) and the
work is done by its **worker**, the same command line as a child process:

1. :func:`rendezvous`: before any JAX call, the supervisors gather on the coordinator's port
   (process 0 listens there, the others connect; JAX binds the port only afterwards) until all
   ``num_processes`` have said hello or ``INFODIFF_DISTRIBUTED_TIMEOUT`` seconds have passed:
   the processes that never joined are named, on every process, before JAX starts. The
   connections stay open as the run's **links** (process 0 relays between the others).
2. :func:`supervise` starts the worker (which joins ``jax.distributed`` as before), forwards
   signals to it and passes its stderr through, holding back what looks like a failure
   (``error:`` lines, tracebacks, C++ ``E``/``F`` log lines, abort dumps) for a few seconds or
   until it is known to be the echo of a peer's failure. A link that closes without an exit
   status (a supervisor killed, e.g. by ``kill -9``: at once; its host gone silent: TCP
   keepalive, within ``min(INFODIFF_DISTRIBUTED_TIMEOUT, 60)`` s) or a worker that stopped on
   its own is relayed to every process; each stops its worker, prints ONE line
   (:func:`lost_line`) and exits with :data:`EXIT_PEER`. A supervisor killed takes its worker
   with it (``PR_SET_PDEATHSIG``, Linux).

Exit statuses of a supervised process: the worker's own (0, 1 for a one-line error, 128 + N
for a signal), or :data:`EXIT_PEER` (75, ``EX_TEMPFAIL``: rerun all processes with the same
command; training resumes from its last checkpoint) when another process died, stopped, or
never joined. ``--debug`` / ``INFODIFF_TRACEBACK=1`` pass the worker's output through
unfiltered.
"""

from __future__ import annotations

import errno
import os
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time

__all__ = ["EXIT_PEER", "TIMEOUT_ENV", "WORKER_ENV", "DistributedError", "PeerError", "PeerMissing", "PeerLost",
           "timeout_s", "settings", "cluster_detected", "cluster_settings", "is_worker", "rendezvous", "supervise",
           "missing_line", "lost_line", "status_words"]

EXIT_PEER = 75  # sysexits.h EX_TEMPFAIL: another process died, stopped or never joined; rerun all
TIMEOUT_ENV = "INFODIFF_DISTRIBUTED_TIMEOUT"
DEFAULT_TIMEOUT_S = 300
WORKER_ENV = "INFODIFF_DISTRIBUTED_WORKER"  # set in the worker: it joins JAX itself, unsupervised
PROTOCOL = "infodiff-join 1"
GRACE_S = 10.0  # a peer stopped with an exit status: this worker may stop by itself meanwhile
NEWS_S = 2.0  # this worker failed: how long to wait for news of a peer that would explain it
HOLD_S = 3.0  # failure-looking output of a live worker is shown after this long without news
ABORT_STATUS = 128 + signal.SIGABRT


class DistributedError(ValueError):
    """A bad multi-process setting (address, process count or id, mesh shape): one line."""


class PeerError(RuntimeError):
    """Another process of the run is missing or lost; ``status`` is the exit status to use."""

    def __init__(self, message: str, status: int = EXIT_PEER):
        super().__init__(message)
        self.status = status


class PeerMissing(PeerError):
    """Processes that did not join within the timeout (or a coordinator that never answered)."""


class PeerLost(PeerError):
    """A process of a started run died or stopped."""


def _line(e: BaseException) -> str:
    return f"error: {type(e).__name__}: {' '.join(str(e).split())}"


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------
def _int_setting(value, name: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DistributedError(f"{name}={value!r} is not an integer") from None


def timeout_s(environ=None) -> int:
    """``INFODIFF_DISTRIBUTED_TIMEOUT`` (seconds, default 300): how long processes wait for each
    other to join, and at most how long a silent (unreachable) process goes unnoticed."""
    env = os.environ if environ is None else environ
    t = _int_setting(env.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S)), TIMEOUT_ENV)
    if t is None or t < 1:
        raise DistributedError(f"{TIMEOUT_ENV}={env.get(TIMEOUT_ENV)!r} must be a whole number of seconds >= 1")
    return t


def settings(coordinator_address=None, num_processes=None, process_id=None, environ=None):
    """``(address, num_processes, process_id)`` of a multi-process run, validated; None for a
    single process; ``"cluster"`` when a SLURM / Open MPI / multi-host TPU job is detected and no
    explicit setting is given (JAX finds the settings). Explicit arguments win over
    ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``. Raises
    DistributedError (one line) for a bad or incomplete setting."""
    env = os.environ if environ is None else environ
    address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
    n = _int_setting(num_processes if num_processes is not None else env.get("JAX_NUM_PROCESSES"),
                     "num_processes")
    pid = _int_setting(process_id if process_id is not None else env.get("JAX_PROCESS_ID"), "process_id")
    if address is None and n is None and pid is None:
        return "cluster" if cluster_detected(env) else None
    if n is not None and n < 1:
        raise DistributedError(f"num_processes={n} must be >= 1")
    if n == 1 and address is None:
        return None
    if address is None:
        raise DistributedError("num_processes / process_id given without --coordinator_address=HOST:PORT "
                               "(the address of process 0, the same for every process)")
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedError(f"coordinator_address={address!r} must be HOST:PORT (e.g. 10.0.0.1:1234)")
    if n is None or pid is None:
        raise DistributedError(f"coordinator_address={address!r} needs --num_processes and --process_id "
                               "(or JAX_NUM_PROCESSES / JAX_PROCESS_ID)")
    if not 0 <= pid < n:
        raise DistributedError(f"process_id={pid} must be in [0, {n}) for num_processes={n}")
    return address, n, pid


def cluster_detected(environ=None) -> str | None:
    """The kind of multi-process job the environment describes ('slurm', 'ompi', 'tpu'), for
    which ``jax.distributed.initialize()`` finds the coordinator itself; None otherwise (also for
    a one-task SLURM job or a single-host TPU)."""
    env = os.environ if environ is None else environ

    def more_than_one(name):
        try:
            return int(env.get(name, "1")) > 1
        except ValueError:
            return False

    if "SLURM_JOB_ID" in env and more_than_one("SLURM_NTASKS"):
        return "slurm"
    if more_than_one("OMPI_COMM_WORLD_SIZE"):
        return "ompi"
    if "," in env.get("TPU_WORKER_HOSTNAMES", ""):
        return "tpu"
    return None


def cluster_settings(timeout: int):
    """What ``jax.distributed.initialize()`` would find in a detected cluster (JAX's own
    detection; imports JAX, but initializes no backend)."""
    from jax._src import clusters  # jax 0.10.2: the detection jax.distributed.initialize runs

    address, n, pid, _ = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        None, None, None, None, None, timeout)
    return settings(address, n, pid, environ={})


def is_worker(environ=None) -> bool:
    """True in the worker a supervisor started (it joins JAX itself, unsupervised)."""
    return (os.environ if environ is None else environ).get(WORKER_ENV) == "1"


def _plural(ids: list[int], n: int) -> str:
    return (f"process {ids[0]} of {n}" if len(ids) == 1
            else f"processes {', '.join(map(str, ids))} of {n}")


def missing_line(missing: list[int], n: int, timeout: int, address: str) -> str:
    ids = " / ".join(map(str, missing))
    them = "it" if len(missing) == 1 else "them"
    return _line(PeerMissing(
        f"{_plural(missing, n)} did not join within {timeout} s ({TIMEOUT_ENV}): start {them} "
        f"(--process_id={ids}, the same command otherwise; coordinator {address}) or raise the timeout"))


def status_words(status: int) -> str:
    """How a worker ended, in words: 'exit status 1', 'killed by SIGKILL', ..."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"killed by {name}" + (" (out of memory? see the kernel log on its host)"
                                     if -status == signal.SIGKILL else "")
    return f"exit status {status}"


def lost_line(k: int, n: int, status: int | None, command: str = "") -> str:
    """The one line every survivor prints when process ``k`` died (``status`` None: its link
    closed without an exit status) or stopped (its worker's status; negative: a signal)."""
    if status is None:
        what = ("died (its connection closed without an exit status: killed, e.g. by kill -9 or for "
                "memory, or its host went down)")
    elif status < 0 or status == ABORT_STATUS:
        what = f"stopped: {status_words(status)}"
    else:
        what = f"stopped with {status_words(status)} (its own log says why)"
    again = ("; a training run resumes from its last checkpoint" if "train" in os.path.basename(command)
             else "")
    return _line(PeerLost(f"process {k} of {n} {what}; this process stopped too. Rerun all {n} processes "
                          f"with the same command{again}"))


# ---------------------------------------------------------------------------------------------
# Links: the supervisors' own connections
# ---------------------------------------------------------------------------------------------
def _keepalive(sock: socket.socket, timeout: int) -> None:
    """A peer whose host went silent (no FIN, no RST) is noticed by the kernel within about
    ``min(timeout, 60)`` s: keepalive probes after half of it, then 5 probes a tenth apart."""
    d = max(2, min(timeout, 60))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", max(1, d // 2)), ("TCP_KEEPINTVL", max(1, d // 10)),
                        ("TCP_KEEPCNT", 5), ("TCP_USER_TIMEOUT", d * 1000)):
        if hasattr(socket, name):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
            except OSError:
                pass


def _send(sock: socket.socket, text: str) -> bool:
    try:
        sock.sendall(text.encode() + b"\n")
        return True
    except OSError:
        return False


def _readline(sock: socket.socket, buf: bytearray, deadline: float) -> str | None:
    """One line from ``sock`` before ``deadline`` (monotonic); None at EOF, on an error or at
    the deadline."""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            ready, _, _ = select.select([sock], [], [], None if left == float("inf") else left)
            if not ready:
                continue
            data = sock.recv(4096)
        except OSError:
            return None
        if not data:
            return None
        buf += data
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line.decode(errors="replace").strip()


def _listen(address: str) -> socket.socket:
    port = int(address.rpartition(":")[2])
    bind = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS", "")  # JAX's own setting, if given
    host = bind.rpartition(":")[0].strip("[]") if bind else ""
    try:
        if not host and socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=128)
        return socket.create_server((host, port), backlog=128)
    except OSError as e:
        raise DistributedError(f"process 0 cannot listen on port {port} of coordinator_address={address!r}: {e} "
                               "(another run or program uses it? choose another port)") from None


def _hub(address: str, n: int, timeout: int, log) -> dict[int, socket.socket]:
    """Process 0: accept the others until all joined or the deadline."""
    deadline = time.monotonic() + timeout
    srv = _listen(address)
    joined: dict[int, socket.socket] = {}
    pending: dict[socket.socket, bytearray] = {}
    peers: dict[int, str] = {}
    try:
        while len(joined) < n - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([srv, *pending, *joined.values()], [], [], min(left, 1.0))
            for s in ready:
                if s is srv:
                    try:
                        conn, addr = srv.accept()
                    except OSError:
                        continue
                    _keepalive(conn, timeout)
                    pending[conn] = bytearray()
                    continue
                k = next((i for i, c in joined.items() if c is s), None)
                if k is not None:  # a joined process left before the run started: missing again
                    try:
                        gone = not s.recv(4096)
                    except OSError:
                        gone = True
                    if gone:
                        s.close()
                        del joined[k]
                        log(f"process {k} left before all had joined; waiting for it again")
                    continue
                buf = pending[s]
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    del pending[s]
                    s.close()
                    continue
                buf += data
                if b"\n" not in buf and len(buf) < 512:
                    continue
                del pending[s]
                hello = bytes(buf).split(b"\n")[0].decode(errors="replace").split()
                if hello[:2] != PROTOCOL.split() or len(hello) != 4:
                    s.close()  # not one of ours (a port scanner, a stray client)
                    continue
                try:
                    their_n, k = int(hello[2]), int(hello[3])
                except ValueError:
                    s.close()
                    continue
                try:
                    host = s.getpeername()[0].removeprefix("::ffff:")
                except OSError:
                    host = "?"
                problem = None
                if their_n != n:
                    problem = (f"process {k} was started with --num_processes={their_n}, process 0 with {n}: "
                               "start every process with the same command (only --process_id differs)")
                elif k in joined or k == 0:
                    problem = (f"two processes were started with --process_id={k} (from {peers.get(k, 'this host')} "
                               f"and {host}): give each process its own id, 0 to {n - 1}")
                if problem:
                    line = _line(DistributedError(problem))
                    for c in (s, *joined.values()):
                        _send(c, "fail " + line)
                        c.close()
                    raise DistributedError(problem)
                joined[k] = s
                peers[k] = host
                _send(s, f"wait {max(0.0, deadline - time.monotonic()):.1f}")
        missing = sorted(set(range(1, n)) - set(joined))
        if missing:
            for c in joined.values():
                _send(c, f"missing {timeout} " + ",".join(map(str, missing)))
                c.close()
            raise PeerMissing(missing_line(missing, n, timeout, address).split(": ", 2)[2])
        for c in joined.values():
            _send(c, "go")
        return joined
    except BaseException:
        for c in (*pending, *joined.values()):
            c.close()
        raise
    finally:
        srv.close()  # JAX's coordination service binds the port next; the links stay open


def _spoke(address: str, n: int, pid: int, timeout: int) -> dict[int, socket.socket]:
    """Process pid > 0: connect to process 0 (retrying until the deadline) and wait for go."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    deadline = time.monotonic() + timeout
    verdict_by = deadline
    delay = 0.1
    stranger = DistributedError(
        f"coordinator_address={address!r} answers, but not as process 0 of an infodiff run gathering its "
        f"processes: the run started without this one (is --process_id={pid} given twice?), or another program "
        "uses that port")
    silent = False  # connected, said hello, no answer in our protocol
    while True:
        left = verdict_by - time.monotonic()
        if left <= 0:
            if silent:
                raise stranger
            raise PeerMissing(f"process 0 of {n} (the coordinator, {address}) did not answer within {timeout} s "
                              f"({TIMEOUT_ENV}): start it (--process_id=0, the same command otherwise) on that host, "
                              "check --coordinator_address, or raise the timeout")
        try:
            s = socket.create_connection((host, int(port)), timeout=min(left, 5.0))
        except OSError:
            silent = False
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 1.0)
            continue
        s.settimeout(None)
        _keepalive(s, timeout)
        buf = bytearray()
        if not _send(s, f"{PROTOCOL} {n} {pid}"):
            s.close()
            continue
        silent = True
        while True:
            line = _readline(s, buf, max(verdict_by, deadline))
            if line is None:
                if buf:  # bytes, but no line of ours (an HTTP/2 server: JAX's, once the run started)
                    s.close()
                    raise stranger
                break  # process 0 went away (or said nothing): try again until the deadline
            word, _, rest = line.partition(" ")
            if word == "wait":  # joined: process 0 gives the verdict at its own deadline
                silent = False
                verdict_by = time.monotonic() + float(rest or 0) + 10.0
                continue
            if word == "go":
                return {0: s}
            s.close()
            if word == "missing":
                t, _, ids = rest.partition(" ")
                missing = [int(i) for i in ids.split(",") if i]
                raise PeerMissing(missing_line(missing, n, int(t), address).split(": ", 2)[2])
            if word == "fail":
                raise DistributedError(rest.split(": ", 2)[-1])
            raise stranger
        s.close()
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def rendezvous(address: str, n: int, pid: int, timeout: int, log=None) -> dict[int, socket.socket]:
    """Gather the ``n`` supervisors of a run at ``address`` before JAX starts: process 0's
    links to every other process, or another process's link to process 0. Raises PeerMissing
    (status :data:`EXIT_PEER`) naming the processes that did not join within ``timeout``
    seconds, on every process that did; DistributedError (status 1) for two processes with one
    id or different process counts."""
    log = log or (lambda msg: None)
    return _hub(address, n, timeout, log) if pid == 0 else _spoke(address, n, pid, timeout)


# ---------------------------------------------------------------------------------------------
# The worker's output
# ---------------------------------------------------------------------------------------------
# Lines that may be the echo of another process's failure: held back until that is known.
_SUSPECT = re.compile(rb"^(?:[EF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\] |\*\*\* Check failure|Fatal Python error"
                      rb"|terminate called|error: |Traceback \(most recent call last\)|\[Gloo\].*(?:[Ee]rror|fail))")
# A worker that is aborting: its held output is never shown (summarized in one line instead).
_ABORT = re.compile(rb"Check failure stack trace|Fatal Python error: Aborted|terminate called after")
# JAX's client aborting because the coordination service reported an error (a peer or join failure).
_JAX_ABORT = re.compile(rb"\] Terminating process because the JAX distributed service detected fatal errors"
                        rb"[^\n]*?absl::Status: ([^\n]*)")
# A worker error that another process's failure explains (a collective or the runtime lost a peer).
_ECHO = re.compile(rb"Gloo|NCCL|[Cc]onnection (?:closed|reset|refused)|Socket closed|UNAVAILABLE|DEADLINE_EXCEEDED"
                   rb"|coordination service|[Bb]arrier|heartbeat|Broken pipe")


class _Output:
    """The worker's stderr on its way to ours: passed through, except that from a suspicious
    line on everything is held until :meth:`release` (no news of a peer within HOLD_S) or the
    end (:meth:`held`)."""

    def __init__(self, fd: int, raw: bool):
        self.fd, self.raw = fd, raw
        self.lock = threading.Lock()
        self.hold: bytearray | None = None
        self.since = 0.0
        self.partial = bytearray()
        self.mid_line = False  # the last segment fed ended inside a line
        self.open_line = False  # the last bytes written did not end a line
        self.muted = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        try:
            os.write(self.fd, data)
            self.open_line = not data.endswith(b"\n")
        except OSError:
            pass

    def end_line(self) -> None:
        """A newline if what was written last left a line open (a progress bar)."""
        with self.lock:
            if self.open_line:
                self.write(b"\n")

    def feed(self, data: bytes) -> None:
        with self.lock:
            if self.raw:
                self.write(data)
                return
            self.partial += data
            while True:
                m = re.search(rb"[\r\n]", self.partial)
                if m is None:
                    break
                seg = bytes(self.partial[:m.end()])
                del self.partial[:m.end()]
                self._segment(seg, complete=True)
            # a long unterminated segment (a progress bar redrawn with \r) goes out at once
            if self.partial and (self.mid_line or len(self.partial) >= 48) and self.hold is None:
                seg = bytes(self.partial)
                self.partial.clear()
                self._segment(seg, complete=False)

    def _segment(self, seg: bytes, complete: bool) -> None:
        if self.hold is None and not self.mid_line and _SUSPECT.match(seg):
            self.hold = bytearray()
            self.since = time.monotonic()
        if self.hold is not None:
            self.hold += seg
        elif not self.muted:
            self.write(seg)
        self.mid_line = not complete

    def release(self, now: float) -> None:
        """Show held output that no news explained within HOLD_S (not an abort's)."""
        with self.lock:
            if (self.hold is not None and now - self.since >= HOLD_S and not _ABORT.search(self.hold)
                    and not self.muted):
                self.write(bytes(self.hold))
                self.hold = None

    def finish(self) -> bytes:
        """Everything held (and an unterminated tail); nothing more is shown."""
        with self.lock:
            held = bytes(self.hold or b"") + bytes(self.partial)
            self.hold, self.partial, self.muted = None, bytearray(), True
            return held


def _pump(stream, out: _Output) -> None:
    fd = stream.fileno()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError as e:
            if e.errno == errno.EINTR:
                continue
            break  # EIO: a pty whose other end closed
        if not data:
            break
        out.feed(data)


# ---------------------------------------------------------------------------------------------
# The supervisor
# ---------------------------------------------------------------------------------------------
def _pdeathsig():
    """In the worker, before exec: SIGKILL when the supervisor dies (Linux; elsewhere nothing)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, ImportError):
        return None
    parent = os.getpid()

    def preexec():
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the supervisor died before that
            os._exit(EXIT_PEER)

    return preexec


def _reader(k: int, sock: socket.socket, events: queue.Queue) -> None:
    buf = bytearray()
    while True:
        line = _readline(sock, buf, float("inf"))
        if line is None:
            events.put(("eof", k, None))
            return
        events.put(("msg", k, line))


def supervise(argv: list[str], address: str, n: int, pid: int, timeout: int, raw: bool = False) -> int:
    """Run ``python argv`` (this program's command line: ``sys.orig_argv[1:]``) as the worker
    of process ``pid`` of ``n`` and return this process's exit status (see the module
    docstring). ``raw``: pass the worker's output through unfiltered (``--debug``)."""
    program = os.path.basename(sys.argv[0])
    say_lock = threading.Lock()

    def say(text: str) -> None:
        with say_lock:
            try:
                os.write(2, text.encode() + b"\n")
            except OSError:
                pass

    say(f"process {pid} of {n}: joining the run at {address} (waiting up to {timeout} s for all processes; "
        f"set {TIMEOUT_ENV} to change)")
    try:
        links = rendezvous(address, n, pid, timeout, log=lambda m: say(f"process {pid} of {n}: {m}"))
    except (PeerError, DistributedError) as e:
        say(_line(e))
        return e.status if isinstance(e, PeerError) else 1

    env = dict(os.environ, **{WORKER_ENV: "1", TIMEOUT_ENV: str(timeout), "JAX_COORDINATOR_ADDRESS": address,
                              "JAX_NUM_PROCESSES": str(n), "JAX_PROCESS_ID": str(pid)})
    tty = not raw and os.isatty(2)
    master = slave = None
    if tty:  # the worker keeps a terminal (progress bar, its width), now one we read
        import pty
        import tty as tty_lib

        master, slave = pty.openpty()
        try:
            import fcntl
            import termios

            tty_lib.setraw(slave)  # bytes as written: no \n -> \r\n
            fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(2, termios.TIOCGWINSZ, b"\0" * 8))
        except Exception:  # termios.error, OSError: a terminal without a size
            pass
    events: queue.Queue = queue.Queue()
    try:
        worker = subprocess.Popen([sys.executable, *argv], env=env, stdin=subprocess.DEVNULL,
                                  stderr=slave if tty else subprocess.PIPE, process_group=0,
                                  preexec_fn=_pdeathsig())
    except OSError as e:
        say(f"error: cannot start the worker process: {e}")
        for s in links.values():
            _send(s, f"exit {pid} 1")
        return 1
    if tty:
        os.close(slave)
        stream = os.fdopen(master, "rb", buffering=0)
    else:
        stream = worker.stderr
    out = _Output(2, raw)
    pump = threading.Thread(target=_pump, args=(stream, out), daemon=True)
    pump.start()
    for k, s in links.items():
        threading.Thread(target=_reader, args=(k, s, events), daemon=True).start()
    threading.Thread(target=lambda: events.put(("worker", pid, worker.wait())), daemon=True).start()

    def forward(signum, frame):
        del frame
        try:
            os.killpg(worker.pid, signum)
        except OSError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    if tty and hasattr(signal, "SIGWINCH"):
        def winch(signum, frame):
            del signum, frame
            try:
                import fcntl
                import termios

                fcntl.ioctl(master, termios.TIOCSWINSZ, fcntl.ioctl(2, termios.TIOCGWINSZ, b"\0" * 8))
                os.killpg(worker.pid, signal.SIGWINCH)
            except OSError:
                pass
        signal.signal(signal.SIGWINCH, winch)

    exited: dict[int, int] = {}  # peers whose worker has stopped: their status
    fault: str | None = None  # the one line, once another process died or stopped
    fault_hard = False  # it died / was killed: this worker's failure is its echo
    grace_until = None
    killed = False
    status = None  # this worker's

    def tell(text: str, but=None) -> None:
        for k, s in list(links.items()):
            if k != but:
                _send(s, text)

    def kill_worker() -> None:
        nonlocal killed
        if status is None and not killed:
            killed = True
            try:
                os.killpg(worker.pid, signal.SIGKILL)
            except OSError:
                pass

    def news(kind: str, k: int, value) -> None:
        """A peer event: from a link (process 0 relays it to the others)."""
        nonlocal fault, fault_hard, grace_until
        if kind == "eof":
            links.pop(k, None)
            if k in exited or k == pid:
                return  # it had stopped and said so
            if pid == 0:
                tell(f"lost {k}")
            if fault is None:
                fault, fault_hard = lost_line(k, n, None, program), True
            kill_worker()
            return
        word, _, rest = value.partition(" ")
        if word == "lost":
            j = int(rest)
            exited.setdefault(j, -signal.SIGKILL)
            if fault is None:
                fault, fault_hard = lost_line(j, n, None, program), True
            kill_worker()
        elif word == "exit":
            j, s = (int(v) for v in rest.split())
            exited[j] = s
            if pid == 0:
                tell(f"exit {j} {s}", but=k)
            if s in (0, EXIT_PEER) or fault is not None:  # EXIT_PEER: it stopped for another's sake
                return
            fault = lost_line(j, n, s, program)
            fault_hard = s < 0 or s == ABORT_STATUS
            if fault_hard:
                kill_worker()
            elif status is None:
                grace_until = time.monotonic() + GRACE_S  # it may be stopping for the same reason

    def handle(ev) -> None:
        nonlocal status
        kind, k, value = ev
        if kind == "worker":
            status = value
            tell(f"exit {pid} {EXIT_PEER if killed else ABORT_STATUS if value == -signal.SIGABRT else value}")
        else:
            news(kind, k, value)

    while status is None:
        try:
            handle(events.get(timeout=0.2))
        except queue.Empty:
            pass
        now = time.monotonic()
        if fault is None:
            out.release(now)
        if grace_until is not None and now >= grace_until:
            fault_hard = True
            kill_worker()
    # The worker has stopped. A failure of its own (an error, JAX's abort; not a kill) may be the
    # echo of a peer's: wait a little for news that explains it.
    if (status > 0 or status == -signal.SIGABRT) and not killed and not fault_hard:
        until = time.monotonic() + NEWS_S
        while time.monotonic() < until and fault is None:
            try:
                handle(events.get(timeout=max(0.01, until - time.monotonic())))
            except queue.Empty:
                break
    pump.join(timeout=2.0)
    held = out.finish()
    own = 128 - status if status < 0 else status
    if status == 0:
        out.write(held)
        return 0
    out.end_line()
    echo = killed or fault_hard or (fault is not None and bool(_ECHO.search(held)))
    if fault is not None and echo:
        say(fault)
        return EXIT_PEER
    m = _JAX_ABORT.search(held)
    if m and not raw:  # JAX's client ended the worker: its status line says what it saw
        detail = " ".join(m.group(1).decode(errors="replace").split())[:200]
        say(_line(PeerLost(f"process {pid} of {n}: JAX's distributed runtime stopped this process ({detail}): "
                           f"another process probably died or is unreachable; rerun all {n} processes with the "
                           "same command (--debug shows JAX's own output)")))
        return EXIT_PEER
    if _ABORT.search(held) and not raw:
        first = next((ln for ln in held.decode(errors="replace").splitlines() if ln.startswith(("F", "terminate"))),
                     "")
        first = " ".join(first.split())[:300]
        say(_line(RuntimeError(f"process {pid} of {n} aborted ({status_words(status)}): {first} (--debug shows "
                               "the whole output)")))
        return own
    out.write(held)
    if status < 0:
        say(f"error: process {pid} of {n}: its worker process was {status_words(status)}")
    return own
