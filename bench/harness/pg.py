"""A throwaway PostgreSQL cluster for the claims-pg scenario: Debian's `postgresql`
binaries, initdb'd into the run's workdir as the `postgres` user, listening on a free
loopback port, pinned to the client CPU (the machine has two: tern has CPU 0, so the
database shares CPU 1 with wrk). Durable settings (fsync and synchronous_commit on, the
defaults) so that a claim's 200 means what it means in production; its CPU time is
read from /proc over the whole cluster (postmaster and every backend)."""

import glob
import os
import shutil
import subprocess

from . import procs
from .servers import CLIENT_CPU, BenchError, free_port


def pg_bin():
    """The newest installed PostgreSQL's bin folder, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    return found[-1] if found else None


class PgCluster:
    def __init__(self, workdir):
        self.bin = pg_bin()
        if self.bin is None:
            raise BenchError("claims-pg needs PostgreSQL: apt-get install postgresql")
        if os.geteuid() != 0:
            raise BenchError("claims-pg runs PostgreSQL as the postgres user: run bench/run as root")
        self.dir = os.path.join(workdir, "pg")
        self.port = free_port()
        self.url = f"postgres://tern@127.0.0.1:{self.port}/postgres"
        self.running = False

    def _as_postgres(self, *argv):
        out = subprocess.run(["runuser", "-u", "postgres", "--", *argv],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise BenchError(f"{' '.join(argv[:2])} failed: {out.stderr.strip()[-500:]}")

    def start(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        shutil.chown(self.dir, "postgres", "postgres")
        data = os.path.join(self.dir, "data")
        self._as_postgres(f"{self.bin}/initdb", "-D", data, "-U", "tern", "-A", "trust", "-E", "UTF8")
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} "
                   "-c shared_buffers=256MB -c max_wal_size=4GB -c checkpoint_timeout=30min")
        self._as_postgres("taskset", "-c", CLIENT_CPU, f"{self.bin}/pg_ctl", "-D", data,
                          "-l", os.path.join(self.dir, "log"), "-w", "-o", options, "start")
        self.running = True

    def postmaster(self):
        try:
            with open(os.path.join(self.dir, "data", "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def cpu_seconds(self):
        """utime + stime of the postmaster and every process under it, plus what its
        children that exited used (cutime + cstime of the postmaster, which reaps them:
        autovacuum workers come and go on these insert-heavy tables)."""
        pid = self.postmaster()
        if not pid:
            return 0.0
        return procs.cpu_seconds(procs.process_tree(pid)) + procs.reaped_children_cpu_seconds(pid)

    def setting(self, name):
        out = subprocess.run([f"{self.bin}/psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "tern",
                              "-d", "postgres", "-Atc", f"SHOW {name}"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip()

    def stop(self):
        if not self.running:
            return
        self.running = False
        data = os.path.join(self.dir, "data")
        subprocess.run(["runuser", "-u", "postgres", "--", f"{self.bin}/pg_ctl", "-D", data,
                        "-m", "fast", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)
