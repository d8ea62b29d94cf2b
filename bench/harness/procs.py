"""What a server costs, read from /proc: CPU time and resident memory of the
server's whole process tree (nginx master + worker, h2o, tern, floor)."""

import os
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid):
    """Fields of /proc/PID/stat after the command name (field 3 is index 0)."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    return data[data.rindex(")") + 2 :].split()


def process_tree(root):
    """root and all its descendants (processes, not threads: /proc/PID/stat of a
    process already sums all its threads)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid = int(_stat_fields(name)[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def cpu_seconds(pids):
    """utime + stime of the given processes, in seconds."""
    total = 0
    for pid in pids:
        try:
            f = _stat_fields(pid)
        except OSError:
            continue  # exited
        total += int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
    return total / CLK_TCK


def reaped_children_cpu_seconds(pid):
    """cutime + cstime of a process: the CPU of its children that exited and it waited
    for, in seconds."""
    try:
        f = _stat_fields(pid)
    except OSError:
        return 0.0
    return (int(f[13]) + int(f[14])) / CLK_TCK  # cutime, cstime (fields 16, 17)


def machine_busy_seconds():
    """CPU time all CPUs spent not idle since boot (from /proc/stat), in seconds."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def self_cpu_seconds():
    """This process (all its threads)."""
    t = os.times()
    return t.user + t.system


def children_cpu_seconds():
    """All children this process has waited for (wrk, the idle client)."""
    t = os.times()
    return t.children_user + t.children_system


def _status_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_bytes(pids):
    """Sum of VmRSS over the processes."""
    return sum(_status_kib(p, "VmRSS:") for p in pids) * 1024


class RssSampler:
    """Samples the summed VmRSS of a process set every `interval` seconds in a
    background thread; `peak` is the largest sum seen."""

    def __init__(self, pids, interval=0.1):
        self.pids = pids
        self.interval = interval
        self.peak = rss_bytes(pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes(self.pids))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes(self.pids))


def wait_port(port, proc, timeout=10.0):
    """Wait until 127.0.0.1:port accepts connections; False if proc died or timed out."""
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def thread_cpus(pid):
    """{thread id: Cpus_allowed_list} for every thread of a process."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[int(tid)] = line.split(":", 1)[1].strip()
        except OSError:
            continue  # exited
    return out


def fs_type(path):
    """The type of the file system holding path (ext4, tmpfs, …), from /proc/mounts."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mnt = fields[1].replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, kind = mnt, fields[2]
    except OSError:
        pass
    return kind


def thread_cpu_seconds(pids):
    """utime + stime per thread name (/proc/PID/task/TID/comm, summed over threads of
    one name), in seconds: where a multi-threaded server spends its CPU."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    comm = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    data = f.read()
            except OSError:
                continue  # exited
            fields = data[data.rindex(")") + 2 :].split()
            out[comm] = out.get(comm, 0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out
