"""A cluster of rank processes for the tests: spawned once, each with a communicator, running
case functions (of ``cases.py``) on command, so that every test is one round trip to every rank.

A case runs on every rank at once; its return values come back as a list by rank, and an
exception on any rank is raised in the test with the rank's traceback. Every wait has a
deadline: a rank that does not answer in time fails the test and the cluster is torn down.
"""

import multiprocessing as mp
import os
import socket
import time
import traceback

HOST = {"MSCCLPP_BACKEND": "host"}

DEADLINE_S = float(os.environ.get("MSCCLPP_PYTEST_DEADLINE", "120"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailure(AssertionError):
    """A case failed on a rank: the rank's exception type, message and traceback."""

    def __init__(self, rank, kind, message, tb):
        super().__init__(f"rank {rank}: {kind}: {message}\n--- rank {rank} traceback ---\n{tb}")
        self.rank, self.kind, self.message = rank, kind, message


def _serve(rank, size, addr, conn, env, options):
    os.environ.update(env)
    import cases
    import mscclpp_rs

    try:
        comm = mscclpp_rs.Communicator(addr, rank, size, **options)
        conn.send(("ok", None))
    except BaseException as e:  # report, then stop: the test sees why
        conn.send(("err", type(e).__name__, str(e), traceback.format_exc()))
        return
    while True:
        msg = conn.recv()
        if msg is None:
            break
        name, kwargs = msg
        try:
            conn.send(("ok", getattr(cases, name)(comm, **kwargs)))
        except BaseException as e:
            conn.send(("err", type(e).__name__, str(e), traceback.format_exc()))
    try:
        comm.barrier()
        comm.close()
    finally:
        conn.send(("ok", None))


class Cluster:
    """``size`` rank processes with a communicator each (``options``: Communicator keywords)."""

    def __init__(self, size, env=None, **options):
        self.size = size
        # Set once a case failed on a rank or a rank was killed: the ranks may be out of step
        # (one left a collective the others are still in), so the fixtures start a new cluster.
        self.broken = False
        ctx = mp.get_context("spawn")
        addr = f"127.0.0.1:{free_port()}"
        env = dict(env or {})
        self.conns, self.procs = [], []
        for r in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(r, size, addr, child, env, options), daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)
        self._collect("communicator set-up")

    def _collect(self, what):
        results = []
        deadline = time.monotonic() + DEADLINE_S
        failure = None
        for r, c in enumerate(self.conns):
            if not c.poll(max(0.0, deadline - time.monotonic())):
                self.kill()
                raise AssertionError(f"{what}: rank {r} did not answer within {DEADLINE_S} s")
            try:
                msg = c.recv()
            except EOFError:
                self.kill()
                raise AssertionError(f"{what}: rank {r} died (exit code {self.procs[r].exitcode})")
            if msg[0] == "ok":
                results.append(msg[1])
            else:
                results.append(None)
                failure = failure or RankFailure(r, *msg[1:])
        if failure:
            self.broken = True
            raise failure
        return results

    def run(self, case, **kwargs):
        """Runs ``cases.<case>(comm, **kwargs)`` on every rank; returns the results by rank."""
        for c in self.conns:
            c.send((case, kwargs))
        return self._collect(case)

    def close(self):
        if self.broken:  # a rank may still wait in a collective its peers left
            self.kill()
            return
        try:
            for c in self.conns:
                c.send(None)
            self._collect("close")
        except (AssertionError, OSError, EOFError):
            pass
        for p in self.procs:
            p.join(10)
        self.kill()

    def kill(self):
        self.broken = True
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(5)


# --- ranks of the construction tests (here: spawned children import them by module name) ---


def from_env_rank(rank, port, q):
    import numpy as np
    import mscclpp_rs

    os.environ.update(HOST, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1))
    try:
        comm = mscclpp_rs.Communicator.from_env()
        x = np.full(5, rank + 1.0, np.float32)
        comm.all_reduce(x)
        q.put((comm.rank, comm.size, comm.local_rank, x.tolist()))
        comm.barrier()
        comm.close()
    except BaseException as e:
        q.put(repr(e))


def uid_rank(rank, q_in, q_out):
    import pickle

    import numpy as np
    import mscclpp_rs

    os.environ.update(HOST)
    try:
        if rank == 0:
            uid = mscclpp_rs.UniqueId("127.0.0.1:0")
            q_out.put(pickle.dumps(uid))
        else:
            uid = pickle.loads(q_in.get(timeout=60))
        comm = mscclpp_rs.Communicator(uid, rank, 2)
        x = np.arange(4, dtype=np.int64) * (rank + 1)
        comm.all_reduce(x, "max")
        q_out.put((rank, x.tolist()))
        comm.barrier()
        comm.close()
    except BaseException as e:
        q_out.put(repr(e))


