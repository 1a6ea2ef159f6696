"""Child processes of the suite that start without importing TensorFlow again (issue 46).

A `python -m tpu_pipeline...` or `python tests/*_child.py` child spends ~5 s of CPU importing TensorFlow
before its first line, and the suite starts a few hundred of them. Here a server process imports
TensorFlow once (and nothing that reads the environment at import, such as our CLI), then forks a child
per request: the child takes the request's argv, environment, working directory and stdin/stdout/stderr,
and runs the module or script as `python` would. It is a real process with its own pid: a test's
SIGKILL, SIGTERM and exit codes are those of a process started with `subprocess.Popen`.

What a fresh interpreter would differ in, and how it is kept:
- TensorFlow's native log level and whether it loads libtpu are read at import: a server is kept per
  value of the variables read there (KEYED); a child whose TF_CPP_MIN_LOG_LEVEL is unset starts fresh
  (our CLI sets it then, before importing TensorFlow, and a test checks what a user who never set it
  sees), and so does one whose TPU_LOAD_LIBRARY is not 0 (tests of that decision).
- Python's standard streams are set up at start-up (buffering, encoding), and logging handlers made at
  import hold them: the child keeps the server's, on its own descriptors 0-2, so the variables that
  shape them are KEYED too.
- Python's hash seed is fixed per process: two servers per key, used in turn, give consecutive children
  (a killed run and its resume) different seeds, as fresh interpreters have. `random` reseeds itself
  after a fork; NumPy's global generator is reseeded here.
- TensorFlow finds the machine's devices once per process, before its first op (the TPU build waits 4 s
  there for a TPU platform): the server finds them, and the children inherit the answer
  (`_find_devices_once`), except at TF_CPP_MIN_LOG_LEVEL=0, whose INFO lines from that lookup are the child's.
- The garbage collector's thresholds are our CLI's (`tpu_pipeline.system.fewer_collections`) for every
  child, a `tests/*_child.py` script too, which a fresh interpreter would run with CPython's: they change
  when cycles are freed, never a result.
- The exit status reaches the test through the server (the child is the server's), so `Popen.wait`,
  `poll` and `communicate` read it from the request's socket.

`ForkServerPopen` is `subprocess.Popen` with that path for the children it fits; everything else (a
`-c` program, a shell, `preexec_fn`, other interpreters) starts as before. tests/conftest.py installs it
unless TPU_PIPELINE_TEST_FORK_SERVER=0.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
KEYED = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE", "TF_ENABLE_ONEDNN_OPTS", "PYTHONPATH",
         "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE", "CUDA_VISIBLE_DEVICES", "XLA_FLAGS",
         "TF_XLA_FLAGS", "LD_LIBRARY_PATH", "LD_PRELOAD", "TPU_LOAD_LIBRARY", "TF_CPP_MIN_VLOG_LEVEL",
         "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "TPU_PIPELINE_LIBTPU_HELD_BACK", "KERAS_BACKEND",
         "TF_USE_LEGACY_KERAS", "PYTHONIOENCODING", "LANG", "LC_ALL", "LC_CTYPE")
SERVERS_PER_KEY = 2
# What the server imports before it forks: TensorFlow and the modules of ours a `train` child imports, none
# of which reads the environment at import (tpu_pipeline.cli does: its children import it themselves).
PRELOADED = ("numpy", "tensorflow", "tpu_pipeline.commands._common", "tpu_pipeline.train.runner")
_STATUS = struct.Struct("!i")
_OriginalPopen = subprocess.Popen
_SERVER_PYTHONPATH: Optional[str] = None


# ---------------------------------------------------------------- the server (its own process)

def serve(address: str) -> dict:
    """Import TensorFlow, then fork a child per request; returns only in a child, with its request."""
    global _SERVER_PYTHONPATH
    _SERVER_PYTHONPATH = os.environ.get("PYTHONPATH")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in pytest ends the run, which ends the servers
    import importlib

    import tpu_pipeline  # noqa: F401  (first, as in our CLI: it decides whether TensorFlow may load libtpu)
    from tpu_pipeline.system import fewer_collections

    fewer_collections()  # as our CLI does first; a script child (tests/*_child.py) gets them too

    for module in PRELOADED + (("tf_keras",) if os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true") else ()):
        importlib.import_module(module)
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "0":  # at 0 the lookup's INFO lines are the child's to print
        _find_devices_once()

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".tmp")
    listener.listen(64)  # before the name appears: a client that sees it may connect at once (else: refused)
    os.rename(address + ".tmp", address)  # the client connects once the import is done
    while True:
        connection, _ = listener.accept()
        header, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
        size = _STATUS.unpack(header[:_STATUS.size])[0]
        header = header[_STATUS.size:]
        while len(header) < size:
            header += connection.recv(size - len(header))
        request = json.loads(header.decode())
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in list(_WAITING):
                other.close()
            return _become_child(request, connection, fds)
        for fd in fds:
            os.close(fd)
        connection.sendall(_STATUS.pack(pid))
        _WAITING.add(connection)
        threading.Thread(target=_report_exit, args=(pid, connection), daemon=True).start()


def _find_devices_once() -> None:
    """What TensorFlow looks up once per process, before its first op, looked up here for every child.

    The TPU TensorFlow, without libtpu (TPU_LOAD_LIBRARY=0, as on this machine), looks for a TPU platform five
    times a second apart: 4 s of each child's wall time. C++ keeps the answer in a static, which a fork
    inherits. Only the C++ list is taken: the Python context, its threads and its cached devices stay unmade,
    so a child still splits the CPU or chooses its devices as a fresh process does. What the lookup logs
    (at most an error line where CUDA is missing) the server prints once, not each child; at
    TF_CPP_MIN_LOG_LEVEL=0 it logs INFO lines a test may look for (tests/test_cli.py), so there each child
    looks its devices up itself.
    """
    from tensorflow.python import pywrap_tfe

    pywrap_tfe.TF_ListPhysicalDevices()


_WAITING: set = set()  # the server's connections to tests waiting on a child (a new child closes its copies)


def _report_exit(pid: int, connection: socket.socket) -> None:
    _, status = os.waitpid(pid, 0)
    try:
        connection.sendall(_STATUS.pack(status))
    except OSError:
        pass  # the test gave up on it
    _WAITING.discard(connection)
    connection.close()


def _become_child(request: dict, connection: socket.socket, fds: list[int]) -> dict:
    connection.close()
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.get("PYTHONUNBUFFERED"):  # what -u gives: each write out at once
        sys.stdout.reconfigure(line_buffering=True, write_through=True)
        sys.stderr.reconfigure(line_buffering=True, write_through=True)
    import numpy

    numpy.random.seed()  # a fresh interpreter's global generator is seeded from the OS
    return request


def run_child(request: dict) -> None:
    """Run the request's module or script as `python` would (in the server's forked `__main__`)."""
    import runpy

    argv = request["argv"]
    # sys.path as `python` makes it: the script's folder (or the working directory), PYTHONPATH, the rest
    server_entries = _entries(_SERVER_PYTHONPATH)
    rest = [entry for entry in sys.path[1:] if entry not in server_entries]
    first = os.getcwd() if argv[1] == "-m" else os.path.dirname(os.path.abspath(argv[1]))
    sys.path[:] = [first, *_entries(request["env"].get("PYTHONPATH")), *rest]
    if argv[1] == "-m":
        sys.argv = ["-m", *argv[3:]]
        runpy._run_module_as_main(argv[2], alter_argv=True)
    else:
        sys.argv = list(argv[1:])
        runpy.run_path(argv[1], run_name="__main__")


# ---------------------------------------------------------------- the test process's side

class _Servers:
    """This process's servers, by key, started on first use and stopped at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple, list] = {}
        self._turn: dict[tuple, int] = {}
        self._dir: Optional[str] = None
        atexit.register(self.stop)

    def server(self, env: dict) -> tuple:
        """(process, socket address) of a server for a child with this environment."""
        env = {**env, "PYTHONPATH": _server_path(env.get("PYTHONPATH"))}
        key = tuple(env.get(name) for name in KEYED)
        with self._lock:
            servers = self._by_key.setdefault(key, [])
            turn = self._turn.get(key, 0)
            self._turn[key] = turn + 1
            if len(servers) < SERVERS_PER_KEY and turn == len(servers):  # each started on its first turn
                self._dir = self._dir or tempfile.mkdtemp(prefix="tpu_pipeline_fork_")
                servers.append(self._start(env, sum(map(len, self._by_key.values()))))
            return servers[turn % SERVERS_PER_KEY]

    def _start(self, env: dict, number: int) -> tuple:
        address = os.path.join(self._dir, f"s{number}")
        server_env = {name: env[name] for name in KEYED if env.get(name) is not None}
        server_env.update({name: os.environ[name] for name in ("PATH", "HOME", "TMPDIR") if name in os.environ})
        program = f"import sys; sys.path[0] = {HERE!r}; import fork_server as f; f.run_child(f.serve({address!r}))"
        with open(address + ".log", "wb") as log:  # what it printed importing (a test's own output stays its own)
            # In the test's own session and process group, as a Popen child is: Linux shares the CPU between
            # sessions (autogroups) first, so a server in a session of its own gave its children as much CPU as
            # both test workers together (measured: the in-process tests 5.8 min slower in all, the slow ones
            # 2.9 min faster). A Ctrl-C reaches the server's children as it reached Popen's; the server ignores it.
            process = _OriginalPopen([sys.executable, "-c", program], env=server_env, stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log)
        return process, address

    @staticmethod
    def forked(process: subprocess.Popen) -> bool:
        """Whether this child came from a server (tests/test_fork_server.py)."""
        return getattr(process, "_status_socket", None) is not None

    def stop(self) -> None:
        for servers in self._by_key.values():
            for process, address in servers:
                process.kill()
                process.wait()
        self._by_key.clear()


SERVERS = _Servers()


def _fits(args, executable, preexec_fn, pass_fds, shell, env, gid, gids, uid, umask, process_group) -> bool:
    if shell or executable or preexec_fn or pass_fds or any(v not in (None, -1) for v in (gid, gids, uid, umask)):
        return False
    if process_group not in (None, -1) or isinstance(args, (str, bytes)) or len(args) < 2:
        return False
    if os.fspath(args[0]) != sys.executable or "TF_CPP_MIN_LOG_LEVEL" not in env:
        return False
    if env.get("TPU_LOAD_LIBRARY") != "0":  # whether TensorFlow loads libtpu is decided at its import
        return False
    args = [os.fspath(a) for a in args]
    if args[1] == "-m":
        return len(args) > 2 and args[2].split(".")[0] == "tpu_pipeline"
    return os.path.dirname(os.path.abspath(args[1])) == HERE and args[1].endswith("_child.py")


class ForkServerPopen(subprocess.Popen):
    """subprocess.Popen whose `python -m tpu_pipeline...` and tests/*_child.py children are forked by a
    server that has TensorFlow imported; other children start as always."""

    _status_socket: Optional[socket.socket] = None

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                       restore_signals, gid, gids, uid, umask, start_new_session, process_group):
        env_now = dict(os.environ if env is None else env)
        if not _fits(args, executable, preexec_fn, pass_fds, shell, env_now, gid, gids, uid, umask, process_group):
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                                          creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread,
                                          errwrite, restore_signals, gid, gids, uid, umask, start_new_session,
                                          process_group)
        request = {"argv": [os.fspath(a) for a in args], "env": {os.fsdecode(k): os.fsdecode(v) for k, v in env_now.items()},
                   "cwd": os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd(),
                   "new_session": bool(start_new_session)}
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
        connection = _connect(*SERVERS.server(env_now))
        try:
            header = json.dumps(request).encode()
            socket.send_fds(connection, [_STATUS.pack(len(header)) + header], fds)
            self.pid = _STATUS.unpack(_receive(connection, _STATUS.size))[0]
        except BaseException:
            connection.close()
            raise
        self._status_socket = connection
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _status_wait(self, pid: int, flags: int) -> tuple[int, int]:
        """os.waitpid for a child of the server: its status comes on the request's socket."""
        connection = self._status_socket
        connection.setblocking(not flags & os.WNOHANG)
        try:
            data = _receive(connection, _STATUS.size)
        except BlockingIOError:
            return 0, 0
        connection.close()
        return self.pid, _STATUS.unpack(data)[0]

    def _try_wait(self, wait_flags):
        if self._status_socket is None:
            return super()._try_wait(wait_flags)
        return self._status_wait(self.pid, wait_flags)

    def _internal_poll(self, _deadstate=None, _waitpid=os.waitpid, _WNOHANG=os.WNOHANG, _ECHILD=10):
        if self._status_socket is not None:
            _waitpid = self._status_wait
        return super()._internal_poll(_deadstate, _waitpid, _WNOHANG, _ECHILD)


def _entries(pythonpath: Optional[str]) -> list[str]:
    return [os.path.abspath(entry) for entry in (pythonpath or "").split(os.pathsep) if entry]


def _server_path(pythonpath: Optional[str]) -> Optional[str]:
    """A child's PYTHONPATH as its server's: without tests/, which children add for their helpers."""
    kept = [entry for entry in _entries(pythonpath) if entry != HERE]
    return os.pathsep.join(kept) or None


def _connect(process: subprocess.Popen, address: str) -> socket.socket:
    """Wait for the server to listen (it imports TensorFlow first; on a loaded machine, tens of seconds)."""
    import time

    while not os.path.exists(address):
        if process.poll() is not None:
            with open(address + ".log", errors="replace") as log:
                printed = log.read()[-3000:]
            raise RuntimeError(f"the fork server for {address} exited with {process.returncode} before it listened "
                               f"(TPU_PIPELINE_TEST_FORK_SERVER=0 starts children without it); it printed:\n{printed}")
        time.sleep(0.02)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(address)
    return connection


def _receive(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:  # end of stream (no data yet raises BlockingIOError in recv itself)
            raise RuntimeError("the fork server closed the connection before the child's exit status")
        data += chunk
    return data


def install() -> None:
    """Make `subprocess.Popen` (and so `subprocess.run`) this class in the test process."""
    subprocess.Popen = ForkServerPopen
